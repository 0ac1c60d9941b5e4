"""kvgraft library: content-addressed blob store, SQLite index and packs (no llama.cpp, no Qt)."""
