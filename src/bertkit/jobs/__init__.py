"""Jobs over a corpus: embed or predict every row of many files, at constant memory, resumable.

One job description (`EmbedConfig`, or a `Predictor` with `predict --output FOLDER`) is run by
one process, by N local processes (`--workers N`) or by Ray Data on a cluster (`--ray`), and
writes the same folder whichever runs it:

    vectors/
      manifest.json           the model and its digest, pooling, normalisation, dimension,
                              precision, the inputs' digests, rows per shard, each shard's rows
                              and digest, the count of each issue
      issues.jsonl            every row with an issue (empty, missing, truncated), a line
      part-00000.parquet      rows 0 .. R-1 of the inputs in order: id, vector (or the
      part-00001.parquet      answer's columns), the kept columns, issue

Shard k always holds the same rows (the inputs' rows k*R .. (k+1)*R-1), each shard is written
atomically, and a batch is formed from its own rows only, so a run killed anywhere and resumed
(`--resume`) ends with the same bytes as one never stopped; a resume against changed inputs or
another model is refused by name.

- `inputs`: the rows of many files (a glob, several formats, a dataset by name), each with a
  stable key, streamed; positions to start reading from (the plan other processes follow).
- `shards`: the folder's layout, its manifest, resuming.
- `embed`: the embedding job (`bertkit embed`); `run`: the job's runners (one process, N
  processes); `ray`: the same on Ray Data.
"""
