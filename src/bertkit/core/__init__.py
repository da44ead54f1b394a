"""The model core: what a BERT is and how it is stored, free of data, tasks and training.

`config` (BertConfig: Google's and Hugging Face's configs, the released sizes), `tokenizer`
(WordPiece, exact to Google's), `model` (the encoder, with `unpad` and `dropout` for its fast
paths), `heads` and `lm_head` (every head of the paper), `embedding` (pooling, the bi-encoder),
`losses`, `checkpoint` and `tf_bundle` (checkpoints in and out) and `hub` (models by Hub name).
Everything else in bertkit builds on these; nothing here imports the rest.
"""
