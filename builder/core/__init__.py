"""What both machines use, on builder's base dependencies only: errors, URLs, HTTP, progress,
input checks, the cache, settings, the registry, the shared command options."""
