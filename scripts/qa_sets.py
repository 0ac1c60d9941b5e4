"""The held-out question sets of scripts/library_qa.py: documents, one question each, absent questions.

Each set is a list of documents ({"title", "text", "question", "key"}) and a list of questions about
names no document holds (they must be answered fresh). An answer counts as correct when it contains
the key, case-insensitive.

- easy: invented documents, each question in the document's own words (the set the first rule was
  tuned on; the same documents as before for a given seed).
- paraphrase: invented documents that mention three other documents' places in passing, each asked
  in other words (no sentence of the document repeated).
- neardup: pairs of documents about the same place from different years; each question names the
  year it asks about.
- pydoc: real texts nobody here wrote: topics of Python's own documentation (`pydoc_data.topics`,
  shipped with every Python), with questions written by hand in our own words.
"""

from __future__ import annotations

import random

from kvgraft.app.core.textgen import synthetic_text

SYLLABLES = "dor mar vel qu ist an bel tor ren sal mi ka lo thu ven gri os pa zel run fe ad ko lys".split()
ROLES = ["lighthouse keeper", "harbor master", "head brewer", "chief archivist", "bridge warden", "clockmaker"]
# the same roles in other words, for a question that repeats no sentence of its document
ROLE_ASKED = {
    "lighthouse keeper": "Who tends the light on the coast at {place}?",
    "harbor master": "Who is in charge of the port at {place}?",
    "head brewer": "Who makes the beer in {place}?",
    "chief archivist": "Who looks after the old records of {place}?",
    "bridge warden": "Who guards the crossing over the water at {place}?",
    "clockmaker": "Who builds the timepieces of {place}?",
}
ROLE_IN_YEAR = {
    "lighthouse keeper": "In {year}, who tended the light on the coast at {place}?",
    "harbor master": "Who was in charge of the port at {place} in {year}?",
    "head brewer": "Who made the beer in {place} in {year}?",
    "chief archivist": "In {year}, who looked after the old records of {place}?",
    "bridge warden": "Who guarded the crossing over the water at {place} in {year}?",
    "clockmaker": "In {year}, who built the timepieces of {place}?",
}
YEAR_ASKED = ["When does {place} first appear in the written sources?", "Since what year has {place} been on record?"]
RIVER_ASKED = ["What is the name of the water flowing past {place}?", "Which stream crosses {place}?"]


def name(rng: random.Random, parts: int = 2) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()


def _filler(rng: random.Random, facts: list[str]) -> list[str]:
    words = rng.randint(1000, 2500)
    paras = [synthetic_text(120, rng.randrange(1 << 30)) for _ in range(max(2, words // 120))]
    for fact in facts:
        paras.insert(rng.randrange(len(paras) + 1), fact)
    return paras


def easy_doc(rng: random.Random, i: int) -> dict:
    place = name(rng, 3)
    kind = i % 3
    if kind == 0:
        role, person = rng.choice(ROLES), f"{name(rng)} {name(rng, 3)}"
        fact = f"The {role} of {place} is {person}."
        question, key = f"Who is the {role} of {place}?", person.split()[-1]
    elif kind == 1:
        year = str(rng.randint(1200, 1899))
        fact = f"The town of {place} was founded in the year {year}."
        question, key = f"In what year was {place} founded?", year
    else:
        river = name(rng, 3)
        fact = f"The river that runs through {place} is called the {river}."
        question, key = f"What is the river that runs through {place} called?", river
    title = f"Survey notes on {place}"
    text = f"{title}\n\n" + "\n\n".join(_filler(rng, [fact]))
    return {"title": title, "text": text, "question": question, "key": key}


def absent_question(rng: random.Random) -> str:
    """A question in the easy set's words about a place drawn at random (the caller checks it is absent)."""
    return f"Who is the {rng.choice(ROLES)} of {name(rng, 3)}?"


def _places(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        p = name(rng, 3)
        if p not in out:
            out.append(p)
    return out


def _absent(rng: random.Random, held: set[str], n: int, template) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        p = name(rng, 3)
        if p.lower() not in held:
            out.append(template(rng, p))
    return out


def easy(seed: int, n: int) -> tuple[list[dict], list[str]]:
    rng = random.Random(seed)
    docs: list[dict] = []
    for i in range(n):
        d = easy_doc(rng, i)
        while any(x["title"] == d["title"] for x in docs):  # one document per place: a question names one
            d = easy_doc(rng, i)
        docs.append(d)
    held = {d["title"].split()[-1].lower() for d in docs}  # a drawn name may be one a document holds
    absent: list[str] = []
    while len(absent) < max(1, n // 3):
        q = absent_question(rng)
        if q.rstrip("?").split()[-1].lower() not in held:
            absent.append(q)
    return docs, absent


def paraphrase(seed: int, n: int) -> tuple[list[dict], list[str]]:
    rng = random.Random(seed * 1000 + 27)
    places = _places(rng, n)
    docs = []
    for i, place in enumerate(places):
        others = rng.sample([p for p in places if p != place], 3)
        mention = f"Traders from {others[0]}, {others[1]} and {others[2]} come to the market here every spring."
        kind = i % 3
        if kind == 0:
            role, person = rng.choice(ROLES), f"{name(rng)} {name(rng, 3)}"
            fact, key = f"The {role} of {place} is {person}.", person.split()[-1]
            question = ROLE_ASKED[role].format(place=place)
        elif kind == 1:
            year = str(rng.randint(1200, 1899))
            fact, key = f"The town of {place} was first recorded in the year {year}.", year
            question = rng.choice(YEAR_ASKED).format(place=place)
        else:
            river = name(rng, 3)
            fact, key = f"The river that runs through {place} is called the {river}.", river
            question = rng.choice(RIVER_ASKED).format(place=place)
        title = f"Survey notes on {place}"
        text = f"{title}\n\n" + "\n\n".join(_filler(rng, [fact, mention]))
        docs.append({"title": title, "text": text, "question": question, "key": key})
    held = {p.lower() for p in places}
    return docs, _absent(rng, held, max(1, n // 3), lambda r, p: ROLE_ASKED[r.choice(ROLES)].format(place=p))


def neardup(seed: int, n: int) -> tuple[list[dict], list[str]]:
    """n documents: n // 2 places, two documents each (another year, another person in the same role)."""
    rng = random.Random(seed * 1000 + 28)
    docs = []
    for place in _places(rng, max(1, n // 2)):
        role = rng.choice(ROLES)
        years = sorted(rng.sample(range(1700, 1900), 2))
        for year in years:
            person = f"{name(rng)} {name(rng, 3)}"
            fact = f"In the year {year} the {role} of {place} was {person}."
            title = f"Survey notes on {place}, {year}"
            text = f"{title}\n\n" + "\n\n".join(_filler(rng, [fact]))
            question = ROLE_IN_YEAR[role].format(place=place, year=year)
            docs.append({"title": title, "text": text, "question": question, "key": person.split()[-1]})
    return docs, []


# topic in pydoc_data.topics -> a question in our own words, and the key a right answer contains
PYDOC_QUESTIONS = {
    "assert": ("Which exception is thrown when a debugging check fails?", "AssertionError"),
    "break": ("What statement stops the innermost loop at once?", "break"),
    "pass": ("Which statement does nothing when it runs?", "pass"),
    "global": ("How do you declare that a function's names belong to the module level?", "global"),
    "return": ("What value does a function hand back when nothing follows its exit statement?", "None"),
    "while": ("Which optional clause of a while loop runs once its condition turns false?", "else"),
    "lambda": ("What keyword makes a small nameless function?", "lambda"),
    "continue": ("Which statement skips to the next round of a loop?", "continue"),
    "truth": ("Which special method decides if an object is considered true?", "__bool__"),
    "nonlocal": ("Which statement lets an inner function rebind a variable of the function around it?", "nonlocal"),
    "del": ("Which error do you get when deleting a name that was never bound?", "NameError"),
    "yield": ("Using which keyword inside a def turns it into a generator?", "yield"),
    "if": ("What keyword adds another condition branch after the first test?", "elif"),
    "raise": ("What exception appears if you re-raise with nothing currently being handled?", "RuntimeError"),
    "integers": ("How long may an integer literal be?", "no limit"),
    "context-managers": ("Which method does a context manager run when the block is left?", "__exit__"),
    "dynamic-features": ("Which built-in runs a string of Python statements?", "exec"),
    "try": ("Which clause of a try statement always runs on the way out?", "finally"),
    "booleans": ("What does the not operator give for an empty list?", "True"),
    "with": ("Which method is called on the manager when the block begins?", "__enter__"),
    "typesmapping": ("Which dictionary method removes a key and returns its value?", "pop"),
}
PYDOC_ABSENT = [
    "What is the capital of Peru?",
    "Who wrote the novel Middlemarch?",
    "How many strings does a violin have?",
    "Which river flows through Vienna?",
    "At what temperature does ethanol boil?",
    "Who painted the ceiling of the Sistine Chapel?",
    "What gas do plants take in from the air?",
]


def pydoc(seed: int, n: int) -> tuple[list[dict], list[str]]:
    """Real texts: the same for every seed (the questions were written once, by hand)."""
    from pydoc_data.topics import topics

    docs = []
    for topic, (question, key) in list(PYDOC_QUESTIONS.items())[:n]:
        title = f"Python reference: {topic}"
        docs.append({"title": title, "text": f"{title}\n\n{topics[topic]}", "question": question, "key": key})
    return docs, list(PYDOC_ABSENT)


SETS = {"easy": easy, "paraphrase": paraphrase, "neardup": neardup, "pydoc": pydoc}
