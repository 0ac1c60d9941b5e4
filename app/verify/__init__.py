"""`kvgraft verify`: each entry or pack member checked (hashes, replay, graft against fresh), and receipts files."""
