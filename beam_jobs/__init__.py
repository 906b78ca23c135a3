"""Apache Beam preprocessing: canonical records + videos -> WebDataset shards (DESIGN.md §1, §3)."""
