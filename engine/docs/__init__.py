"""Documents for chats and OpenAI's vector stores, torch-free: files converted to text
(`convert.py`), split by their structure (`chunk.py`), kept in one SQLite database with FTS5 and
sqlite-vec (`store.py`), indexed incrementally (`indexer.py`) and found again by hybrid retrieval
(`retrieve.py`); `sources.py` puts the found passages into a prompt and reads the citations back."""
