"""The full sm120 JIT module list compiled in a real image build: `./scripts/test -m heavy`.

Hours on a small machine (the fused MoE module alone is 83 .cu files, 1-2 h on 2 cores; the
fp4 GEMM peaks at 5.7 GB per job), so it is not part of the default run.
"""

from __future__ import annotations

import json

import pytest

from tests.build.test_image import image_args
from tests.conftest import Upstreams, builder_in

pytestmark = [pytest.mark.heavy, pytest.mark.docker]


def test_full_module_list_for_sm_120a(
    tmp_path, github: Upstreams, docker_host, test_base, runtime_index
) -> None:
    builder = builder_in(tmp_path, github, docker_host)
    args = image_args(test_base, runtime_index, "--json")
    at = args.index("--jit-modules")
    del args[at : at + 2]  # the target's own list
    result = json.loads(builder.run(*args).stdout)["image"]
    names = {m["name"] for m in result["jit_inventory"]["modules"]}
    assert {"fused_moe_120", "fp4_quantization_120", "trtllm_comm"} <= names
    assert all("sm_120a" in m["arch"] for m in result["jit_inventory"]["modules"])
