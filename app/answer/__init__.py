"""Answering: ask (one function per source), solve, and conversations (chat)."""
