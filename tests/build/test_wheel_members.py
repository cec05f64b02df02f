"""Which members of a built wheel hold a patched file: the check that a patch shipped, and
what `builder verify` looks for in an image."""

from __future__ import annotations

from builder.build.wheels import _members_for


def test_a_patched_release_metadata_is_found_in_the_repacked_dist_info() -> None:
    """sm120-vllm's series patches vllm-0.34.0.dist-info/METADATA; the repack renames the
    folder for the local version, and the file must still be found there (#57)."""
    names = ["vllm/__init__.py", "vllm-0.34.0+sm120vllm.g82a3bfb.dist-info/METADATA",
             "vllm-0.34.0+sm120vllm.g82a3bfb.dist-info/RECORD"]  # fmt: skip
    assert _members_for("vllm-0.34.0.dist-info/METADATA", names) == [names[1]]
    assert _members_for("vllm-0.34.0.dist-info/WHEEL", names) == []
    assert _members_for("python/sglang/srt/x.py", ["sglang/srt/x.py"]) == ["sglang/srt/x.py"]
    assert _members_for("vllm/METADATA", names) == []  # only a .dist-info folder is renamed
