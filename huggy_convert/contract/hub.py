"""The Hugging Face Hub's and git-lfs's side of the contract: what a clone of a model repository
holds besides ML-Agents' run directory.

``mlagents-push-to-hf`` uploads ``results/<run-id>/`` (and adds ``README.md``, ``config.json``);
``mlagents-load-from-hf`` clones it with git. The Hub tracks ``*.onnx``, ``*.pt`` and the tensorboard
events with git-lfs (its ``.gitattributes``); cloned without git-lfs, each such file is a small text
pointer (git-lfs spec v1: https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md), which a
reader must name as such instead of calling it a damaged file.
"""
from __future__ import annotations

GIT_ATTRIBUTES = ".gitattributes"  # at the root of a clone (the Hub writes its LFS patterns there)
GIT_DIR = ".git"  # a clone's git directory (a file in a worktree or submodule)
LFS_POINTER_MAGIC = b"version https://git-lfs.github.com/spec/"  # the first line of a pointer file
LFS_POINTER_MAX_BYTES = 1024  # the spec: a pointer file is under 1024 bytes
LFS_SIZE_KEY = b"size"  # "size <bytes>": the real file's size
LFS_PULL = "git lfs pull"  # fetches and checks out the real files of a clone
