"""The build host's maintenance loop: follow upstream releases, keep the patch series moving."""
