"""Preparing a corpus beyond one machine (bertkit.pretraining.parts): parts merged, and on a Ray
cluster of two nodes, into the very shards one process makes; bad parts refused by name."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bertkit import cli
from bertkit.pretraining.parts import merge_parts, parse_part
from bertkit.pretraining.shards import prepare_shards

from helpers import synthetic_tokenizer


def corpus(root: Path, files: int = 5, seed: int = 0) -> list[Path]:
    """JSON Lines files of different sizes: documents of paragraphs of synthetic words."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for number in range(files):
        lines = []
        for _ in range(rng.randint(10, 60)):
            text = "\n".join(" ".join(f"w{rng.randrange(400)}" for _ in range(rng.randint(3, 15)))
                             + "." for _ in range(rng.randint(1, 4)))  # fmt: skip
            lines.append(json.dumps({"text": text}))
        path = root / f"part{number}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def shard_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix != ".json"}


def shard_records(folder: Path) -> list[dict]:
    return json.loads((folder / "meta.json").read_text())["shards"]


def test_parts_merged_are_the_shards_one_process_makes(tmp_path):
    """The corpus cut into 3 parts (contiguous runs of its files), each prepared on its own and
    merged: the same shard bytes, digests and counts as one process over the whole corpus,
    also where shards end inside a part."""
    files = corpus(tmp_path / "corpus")
    tokenizer = synthetic_tokenizer()
    whole = prepare_shards(files, tokenizer, tmp_path / "whole", workers=1, progress=False,
                           shard_tokens=700)  # fmt: skip
    assert len(whole["shards"]) >= 4
    parts = [tmp_path / f"part{i}" for i in range(3)]
    for i, folder in enumerate(parts):
        prepare_shards(files, tokenizer, folder, workers=1, progress=False, part=(i, 3))
    merged = merge_parts(parts, tmp_path / "merged", shard_tokens=700)
    assert shard_files(tmp_path / "merged") == shard_files(tmp_path / "whole")
    assert merged["shards"] == whole["shards"]
    assert merged["sources"] == [str(f) for f in files]
    for key in ("num_tokens", "num_sentences", "num_documents", "skipped"):
        assert merged[key] == whole[key], key


def test_the_command_prepares_parts_and_merges_them(tmp_path, capsys):
    files = corpus(tmp_path / "corpus", files=3)
    tokenizer = synthetic_tokenizer()
    tokenizer.save_pretrained(tmp_path / "vocab")
    base = ["prepare", str(tmp_path / "corpus"), "--vocab", str(tmp_path / "vocab")]
    assert cli.main([*base, "--out", str(tmp_path / "whole"), "--workers", "1"]) == 0
    for i in range(2):
        assert cli.main([*base, "--part", f"{i}/2", "--out", str(tmp_path / f"p{i}")]) == 0
    merge = ["prepare", "--merge", str(tmp_path / "p1"), str(tmp_path / "p0"), "--out"]
    assert cli.main([*merge, str(tmp_path / "merged")]) == 0  # (any order: they say theirs)
    assert "from 2 parts" in capsys.readouterr().out
    assert shard_files(tmp_path / "merged") == shard_files(tmp_path / "whole")
    assert shard_records(tmp_path / "merged") == shard_records(tmp_path / "whole")
    assert len(files) == 3


def test_bad_parts_are_refused_by_name(tmp_path):
    """A part missing, a part twice, a shard file changed since, parts of another corpus, a
    folder prepared without --part: each refused, naming what."""
    files = corpus(tmp_path / "corpus", files=4)
    tokenizer = synthetic_tokenizer()
    parts = []
    for i in range(3):
        parts.append(tmp_path / f"p{i}")
        prepare_shards(files, tokenizer, parts[-1], workers=1, progress=False, part=(i, 3))
    with pytest.raises(ValueError, match=r"part 2 is missing"):
        merge_parts(parts[:2], tmp_path / "m1")
    with pytest.raises(ValueError, match=r"a part is given twice"):
        merge_parts([parts[0], parts[1], parts[1], parts[2]], tmp_path / "m2")
    other = corpus(tmp_path / "other", files=4, seed=1)
    prepare_shards(other, tokenizer, tmp_path / "o2", workers=1, progress=False, part=(2, 3))
    with pytest.raises(ValueError, match=r"different corpora"):
        merge_parts([parts[0], parts[1], tmp_path / "o2"], tmp_path / "m3")
    prepare_shards(files, tokenizer, tmp_path / "plain", workers=1, progress=False)
    with pytest.raises(ValueError, match=r"plain: not a part"):
        merge_parts([tmp_path / "plain"], tmp_path / "m4")
    tokens = parts[1] / "shard-00000.tokens"
    data = bytearray(tokens.read_bytes())
    data[0] ^= 1
    tokens.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"shard-00000.tokens"):
        merge_parts(parts, tmp_path / "m5")
    with pytest.raises(ValueError, match=r"--part '3/3': I must be 0 \.\. N-1"):
        parse_part("3/3")
    assert not any((tmp_path / f"m{i}").exists() for i in range(1, 6))


@pytest.mark.slow  # a Ray cluster of two nodes
def test_prepare_on_a_two_node_ray_cluster_equals_one_process(ray_cluster, tmp_path, capsys):
    files = corpus(tmp_path / "corpus", files=4)
    tokenizer = synthetic_tokenizer()
    tokenizer.save_pretrained(tmp_path / "vocab")
    local = prepare_shards(files, tokenizer, tmp_path / "local", workers=1, progress=False)
    argv = ["prepare", str(tmp_path / "corpus"), "--vocab", str(tmp_path / "vocab"), "--out",
            str(tmp_path / "on_ray"), "--ray", ray_cluster]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert shard_files(tmp_path / "on_ray") == shard_files(tmp_path / "local")
    assert shard_records(tmp_path / "on_ray") == local["shards"]
    meta = json.loads((tmp_path / "on_ray" / "meta.json").read_text())
    assert len(meta["merged_from"]) == 2  # one part per CPU of the cluster
    assert not (tmp_path / "on_ray.parts").exists()
