"""The paper's corpora from what people download: MediaWiki dumps to text
passages, books to documents, in the original's text format."""
