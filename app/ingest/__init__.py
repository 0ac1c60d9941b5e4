"""Getting knowledge in: documents (text, markdown, PDF) and the files dropped or named on the command line."""
