"""The question every benchmark asks after a prefix (a fixed text: the timings compare like with like)."""

QUESTION = " Question: which word in the text above came up most often, and how often did it come up? Answer:"
