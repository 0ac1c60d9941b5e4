"""When a stored entry answers a question: the thresholds ask applies (tuned on seeds the README does not report)."""

GRAFT_ANSWER_TOKENS = 24  # an answer copied from a graft is a few tokens and a newline


# A document is grafted for a question only when it contains at least this share of the question's
# content words, weighted by rarity (library/retrieval.py); below it the question is answered fresh and
# says so. Tuned with scripts/library_qa.py on its tuning seed, never on the set the README reports.
RETRIEVAL_MIN_COVERAGE = 0.8
# Below that coverage, or where two documents reach it, the model reads the first READ_CANDIDATES
# documents BM25 ranks (app/answer/reading.py): the one that raises the likelihood of the question's
# tokens most is grafted when it raises it by at least READ_MIN_GAIN nats per token over no document,
# holds the question's names, and, where it is not BM25's first, leads BM25's first by READ_MIN_MARGIN.
# Tuned with scripts/library_qa.py on its tuning seed (101): the right documents' gains were 1.42 and
# up, the absent names' 0.82 at most; the one pick against BM25's first there was wrong, by 0.53.
READ_CANDIDATES = 2
READ_MIN_GAIN = 1.0
READ_MIN_MARGIN = 0.6
# A capitalized word of several tokens whose later tokens average a log-probability below this with
# no document is a name (invented, or unknown to the model): a document must hold it to be grafted.
NAME_SURPRISE = -6.0
# A worked solution is grafted for a question asked in other words only when the question states the
# very same numbers as the solution's stored question (library/retrieval.same_numbers: a sibling
# problem of the same template has other numbers) and the solution holds at least this share of the
# question's other content words (`Ranked.wording`: a paraphrase uses words of its own, so the
# rarity weighting of RETRIEVAL_MIN_COVERAGE, which weighs an absent word the most, would refuse it).
# Tuned with scripts/solution_qa.py on its tuning seed, never on the set the README reports.
SOLUTION_MIN_WORDING = 0.6
