"""The image's entrypoint: `vllm serve ARGS`, with the API key taken from a file.

With VLLM_API_KEY_FILE set (builder launch --api-key-file mounts the key read-only at
/run/secrets/sglang-api-key), the key reaches vLLM as its VLLM_API_KEY inside this process:
it never appears on a command line (`ps`, `docker inspect`), in the container's environment
or in a log. Without it, this is exactly `vllm serve ARGS`.
"""

import os
import runpy
import sys


def main() -> None:
    path = os.environ.pop("VLLM_API_KEY_FILE", None)
    if path:
        if "--api-key" in sys.argv:
            sys.exit("entrypoint: --api-key and VLLM_API_KEY_FILE both given: keep the file")
        try:
            with open(path) as handle:
                lines = handle.read().strip().splitlines()
        except OSError as exc:
            sys.exit(f"entrypoint: VLLM_API_KEY_FILE={path}: cannot read it ({exc.strerror})")
        if not lines or not lines[0].strip():
            sys.exit(f"entrypoint: VLLM_API_KEY_FILE={path}: the file is empty")
        os.environ["VLLM_API_KEY"] = lines[0].strip()
    sys.argv = ["vllm", "serve", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.cli.main", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
