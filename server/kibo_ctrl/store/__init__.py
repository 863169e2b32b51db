"""The store: the Reader/Tx/Store protocols (base.py) and the embedded SQLite store."""
