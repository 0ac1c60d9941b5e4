"""When a stored entry answers a question: the thresholds ask applies (tuned on seeds the README does not report)."""

GRAFT_ANSWER_TOKENS = 24  # an answer copied from a graft is a few tokens and a newline


# A document is grafted for a question only when it contains at least this share of the question's
# content words, weighted by rarity (library/retrieval.py); below it the question is answered fresh and
# says so. Tuned with scripts/library_qa.py on its tuning seed, never on the set the README reports.
RETRIEVAL_MIN_COVERAGE = 0.8
# A worked solution is grafted for a question asked in other words only when the question states the
# very same numbers as the solution's stored question (library/retrieval.same_numbers: a sibling
# problem of the same template has other numbers) and the solution holds at least this share of the
# question's other content words (`Ranked.wording`: a paraphrase uses words of its own, so the
# rarity weighting of RETRIEVAL_MIN_COVERAGE, which weighs an absent word the most, would refuse it).
# Tuned with scripts/solution_qa.py on its tuning seed, never on the set the README reports.
SOLUTION_MIN_WORDING = 0.6
