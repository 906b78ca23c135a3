"""Apache Beam preprocessing: canonical records + videos -> WebDataset shards (docs/architecture.md)."""
