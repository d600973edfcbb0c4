"""Text handling: WordPiece and SentencePiece tokenizers, vocab building, corpus
reading and sentence splitting."""
