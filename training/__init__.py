"""DeepSpeed training of a Hugging Face video VLM for temporal grounding."""
