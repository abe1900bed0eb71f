"""Data in: reading corpora, the byte-level BPE, token files and the codecs that read them back."""
