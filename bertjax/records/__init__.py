"""The contract shared by data creation and training input: the record schema,
TFRecord framing and indexes, and the file layer (local, gs://, gzip)."""
