"""The image's entrypoint: sglang's launch_server, with the API key taken from a file.

With SGLANG_API_KEY_FILE set (builder launch --api-key-file mounts the key read-only at
/run/secrets/sglang-api-key), the key is added to sglang's arguments inside this process:
it never appears on a command line (`ps`, `docker inspect`), in the environment or in a
log (the sglang patch keeps it out of `server_args=` and /server_info). Without it, this is
exactly `python -m sglang.launch_server ARGS`.
"""

import os
import runpy
import sys


def main() -> None:
    path = os.environ.get("SGLANG_API_KEY_FILE")
    if path:
        if "--api-key" in sys.argv:
            sys.exit("entrypoint: --api-key and SGLANG_API_KEY_FILE both given: keep the file")
        try:
            with open(path) as handle:
                lines = handle.read().strip().splitlines()
        except OSError as exc:
            sys.exit(f"entrypoint: SGLANG_API_KEY_FILE={path}: cannot read it ({exc.strerror})")
        if not lines or not lines[0].strip():
            sys.exit(f"entrypoint: SGLANG_API_KEY_FILE={path}: the file is empty")
        sys.argv += ["--api-key", lines[0].strip()]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
