#!/usr/bin/env python3
"""Generate the data sets shipped in data/ (see data/README.md).

    python3 scripts/gen_data.py [--out DIR] [--quiet]

Writes, deterministically (same bytes on every run; Python 3 standard library only):
  data/sentiment/train.tsv  16000 lines "label<TAB>text", label 1 = positive, 0 = negative
  data/sentiment/val.tsv     2000 lines, no sentence shared with train
  data/tinytext/corpus.txt  ~400 KB of English prose for byte-level language modelling
  data/tinytext/val.txt      ~40 KB, generated with a different seed

The sentiment set is built so that the label depends on composition and word order
(negation, "X but Y", "A, not B", expectations, ...), not on which words occur: every
adjective appears in both classes.  Its lexicon (CORE) is small, so that a byte-level model
trained from scratch learns it quickly; the tinytext reviews use the full one (FULL).
After writing, the script prints label counts, length statistics and the accuracy of
bag-of-words baselines (unigram Naive Bayes and unigram logistic regression, trained on
train and tested on val), which must stay well below 80%.
"""

import argparse
import math
import os
import random
import re
import sys
from collections import Counter

SEED_SENTIMENT = 20240601
SEED_CORPUS = 1234
SEED_CORPUS_VAL = 98765

N_TRAIN = 16000
N_VAL = 2000
MAX_TEXT_BYTES = 61          # every sentence text is <= this (seq_len 64, byte tokenizer)
CORPUS_BYTES = 400_000
CORPUS_VAL_BYTES = 40_000

# Family mix (fraction of draws): plain / negated / contrast-or-order forms.  Short plain and
# negated sentences repeat more often, and repeats are drawn again, so the files end up at
# about 43% / 28% / 29%: enough plain sentences to learn word polarity early, then composition.
FAMILY_WEIGHTS = (("plain", 0.50), ("negated", 0.32), ("contrast", 0.18))
FAMILY_WEIGHTS_FULL = (("plain", 0.30), ("negated", 0.35), ("contrast", 0.35))  # tinytext

# ---------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------

# Adjectives that do not take "very/quite/pretty/so" (use "really/truly/absolutely").
EXTREME = set("""great excellent wonderful fantastic amazing superb brilliant outstanding
terrific perfect delightful awful terrible horrible dreadful disgusting useless outrageous
ridiculous unwatchable miserable gorgeous delicious""".split())
# Negative adjectives whose negation does not read as positive ("not mediocre"): these are
# used only in plain and contrast forms.
NOT_NEGATABLE = set("""awful terrible horrible dreadful disgusting useless outrageous
ridiculous unwatchable miserable mediocre poor lousy smelly unhelpful unreliable
uncomfortable unconvincing unpleasant""".split())

# kind -> (positive adjectives, negative adjectives)
ADJ = {
    "film": ("""good great excellent wonderful fantastic amazing superb brilliant delightful
                enjoyable funny clever moving gripping touching charming original fresh smart
                witty engaging exciting beautiful fun entertaining""",
             """bad awful terrible disappointing weak boring dull predictable confusing
                tedious silly forgettable slow pointless messy bland unwatchable mediocre"""),
    "story": ("""good great excellent clever original gripping moving smart witty engaging
                 fresh brilliant strong touching""",
              """bad weak predictable confusing silly dull boring thin clumsy lazy messy
                 awful terrible"""),
    "acting": ("""good great excellent superb convincing natural strong charming believable
                  brilliant wonderful""",
               """bad weak wooden stiff flat unconvincing awful terrible forgettable dull"""),
    "music": ("""good great beautiful lovely memorable catchy wonderful excellent""",
              """bad forgettable annoying loud dull awful repetitive"""),
    "device": ("""good great excellent reliable sturdy fast useful handy solid sleek
                  impressive amazing perfect quiet""",
               """bad flimsy slow noisy fragile clunky useless unreliable overpriced
                  disappointing terrible awful loud"""),
    "software": ("""good great excellent fast reliable useful intuitive responsive smooth
                    simple polished""",
                 """bad slow buggy confusing clunky useless unreliable awful terrible
                    frustrating disappointing"""),
    "screen": ("""good great excellent bright sharp gorgeous beautiful clear""",
               """bad dim blurry dull disappointing awful grainy"""),
    "battery": ("""good great excellent reliable impressive amazing""",
                """bad weak poor disappointing unreliable terrible"""),
    "wear": ("""good great excellent comfortable sturdy solid lovely""",
             """bad uncomfortable flimsy stiff awful disappointing"""),
    "food": ("""good great excellent delicious tasty fresh flavorful amazing perfect
                wonderful lovely superb fantastic""",
             """bad bland cold greasy salty tasteless dry awful terrible disappointing
                disgusting mediocre"""),
    "service": ("""good great excellent friendly helpful attentive fast quick professional
                   wonderful efficient prompt amazing""",
                """bad slow rude careless unhelpful sloppy disappointing awful terrible poor
                   disorganized"""),
    "person": ("""friendly helpful attentive polite kind warm professional lovely great
                  wonderful charming patient""",
               """rude slow careless unhelpful cold lazy dismissive awful terrible grumpy
                  impatient"""),
    "place": ("""clean cozy quiet comfortable spacious charming lovely bright beautiful great
                 wonderful nice pleasant""",
              """dirty noisy cramped shabby dark uncomfortable smelly crowded awful terrible
                 dingy"""),
    "experience": ("""good great excellent wonderful lovely enjoyable pleasant memorable fun
                      relaxing amazing perfect delightful""",
                   """bad awful terrible disappointing boring dull stressful exhausting
                      forgettable miserable unpleasant tedious"""),
    "price": ("""fair reasonable great low""", """high steep outrageous ridiculous"""),
    "portion": ("""generous big huge""", """small tiny stingy"""),
}

# Opposite pairs for "X, not Y" / "X rather than Y" / "more X than Y": kind -> "pos/neg ..."
ANTONYMS = {
    "film": """funny/boring fun/boring exciting/boring gripping/boring engaging/dull clever/silly
               smart/silly original/predictable fresh/predictable entertaining/tedious
               witty/dull""",
    "story": """clever/silly original/predictable fresh/predictable gripping/boring
                engaging/dull smart/silly strong/weak witty/dull""",
    "acting": """convincing/unconvincing natural/stiff natural/wooden strong/weak
                 believable/wooden convincing/wooden""",
    "music": """memorable/forgettable catchy/forgettable beautiful/annoying""",
    "device": """sturdy/flimsy solid/flimsy fast/slow quiet/noisy quiet/loud reliable/unreliable
                 sturdy/fragile sleek/clunky useful/useless""",
    "software": """fast/slow reliable/unreliable intuitive/confusing simple/confusing
                   smooth/clunky polished/buggy responsive/slow smooth/buggy useful/useless""",
    "screen": """bright/dim sharp/blurry clear/blurry sharp/grainy bright/dull""",
    "battery": """reliable/unreliable impressive/disappointing good/poor""",
    "wear": """comfortable/uncomfortable sturdy/flimsy solid/flimsy comfortable/stiff""",
    "food": """flavorful/bland tasty/bland delicious/tasteless flavorful/tasteless""",
    "service": """fast/slow quick/slow friendly/rude helpful/unhelpful attentive/careless
                  professional/sloppy efficient/disorganized prompt/slow efficient/slow""",
    "person": """friendly/rude helpful/unhelpful polite/rude attentive/careless warm/cold
                 kind/rude patient/impatient friendly/grumpy friendly/cold""",
    "place": """clean/dirty quiet/noisy spacious/cramped cozy/cramped bright/dark
                comfortable/uncomfortable charming/shabby clean/smelly quiet/crowded
                spacious/crowded bright/dingy""",
    "experience": """relaxing/stressful fun/boring enjoyable/tedious memorable/forgettable
                     pleasant/unpleasant relaxing/exhausting fun/dull""",
    "price": """fair/outrageous reasonable/steep low/high reasonable/outrageous
                fair/ridiculous reasonable/high""",
    "portion": """generous/stingy big/small huge/tiny generous/small""",
}
GENERIC_POS = set("good great excellent wonderful lovely enjoyable pleasant".split())
GENERIC_NEG = set("bad awful terrible disappointing mediocre poor".split())
# "more X than Y" needs adjectives that take "more"
NO_MORE = set("smart fresh strong weak dull flat thin slow fast good bad great low high big "
              "small huge tiny warm cold kind quick clear sharp dim".split())

ADJ["bill"] = ADJ["price"]
ANTONYMS["bill"] = ANTONYMS["price"]

# kind -> list of (subject, plural)
def _subj(s):
    out = []
    for item in s.split(","):
        item = item.strip()
        if item:
            pl = item.endswith("*")
            out.append((item.rstrip("*"), pl))
    return out

SUBJECTS = {
    "film": _subj("""the movie, the film, this movie, this film, the sequel, the show, this show,
                     the documentary, the series, the first half, the second half"""),
    "story": _subj("""the plot, the story, the script, the ending, the dialogue, the twist,
                      the writing, the premise"""),
    "acting": _subj("""the acting, the cast, the lead actor, the performances*, the actors*,
                       the villain"""),
    "music": _subj("""the soundtrack, the music, the score, the songs*"""),
    "device": _subj("""this phone, the phone, this laptop, the laptop, this tablet, the printer,
                       the router, this camera, the camera, the blender, the vacuum,
                       the coffee maker"""),
    "software": _subj("""the app, this app, the software, the update, the website, the game"""),
    "screen": _subj("""the screen, the display"""),
    "battery": _subj("""the battery, the battery life"""),
    "wear": _subj("""these headphones*, the earbuds*, these shoes*, this jacket, the mattress,
                     this chair, the sofa"""),
    "food": _subj("""the food, the pasta, the soup, the pizza, the steak, the dessert, the bread,
                     the curry, the burger, the fries*, the noodles*, the tacos*, the cake,
                     the sushi, the chicken, the rice"""),
    "service": _subj("""the service, the staff, the support team, the customer service"""),
    "person": _subj("""our waiter, our waitress, the waiter, the host, the manager, the driver,
                       the receptionist, the owner, the bartender, our guide, the tour guide"""),
    "place": _subj("""the hotel, the room, the restaurant, the place, the lobby, the bar,
                      the cafe, the apartment, our room"""),
    "experience": _subj("""the trip, the visit, the experience, the evening, the stay,
                           the tour, the weekend, the flight, the holiday"""),
    "price": _subj("""the price, the prices*"""),
    "bill": _subj("""the bill, the final bill"""),
    "portion": _subj("""the portions*, the portion"""),
}

# Subject groups that may share a sentence ("the acting was weak but the story was great").
DOMAINS = {
    "movie": ["film", "story", "acting", "music"],
    "gadget": ["device", "software", "screen", "battery", "price"],
    "gear": ["wear", "price"],
    "restaurant": ["food", "service", "person", "place", "price", "bill", "portion",
                   "experience"],
    "hotel": ["place", "service", "person", "price", "bill", "experience"],
}

# Verbs: id -> (tense, singular, plural, kinds or None = all, negations, takes phrases)
# negation entries: (singular, plural, "at all" allowed, phrase allowed)
VERBS = {
    "was": ("past", "was", "were", None,
            [("was not", "were not", 1, 1), ("wasn't", "weren't", 1, 1),
             ("was never", "were never", 0, 1), ("was hardly", "were hardly", 0, 1),
             ("was far from", "were far from", 0, 0),
             ("was anything but", "were anything but", 0, 0),
             ("was no longer", "were no longer", 0, 1)], 1),
    "is": ("present", "is", "are", None,
           [("is not", "are not", 1, 1), ("isn't", "aren't", 1, 1),
            ("is never", "are never", 0, 1), ("is hardly", "are hardly", 0, 1),
            ("is far from", "are far from", 0, 0),
            ("is anything but", "are anything but", 0, 0),
            ("is no longer", "are no longer", 0, 1)], 1),
    "felt": ("past", "felt", "felt",
             {"film", "story", "experience", "place", "wear", "price", "bill", "device",
               "software"},
             [("did not feel", "did not feel", 1, 0), ("didn't feel", "didn't feel", 1, 0),
              ("never felt", "never felt", 0, 0), ("hardly felt", "hardly felt", 0, 0)], 0),
    "feels": ("present", "feels", "feel",
              {"film", "story", "experience", "place", "wear", "price", "bill", "device",
               "software"},
              [("does not feel", "do not feel", 1, 0), ("doesn't feel", "don't feel", 1, 0),
               ("never feels", "never feel", 0, 0)], 0),
    "seemed": ("past", "seemed", "seemed", None,
               [("did not seem", "did not seem", 1, 1), ("didn't seem", "didn't seem", 1, 1),
                ("never seemed", "never seemed", 0, 1),
                ("hardly seemed", "hardly seemed", 0, 1)], 0),
    "seems": ("present", "seems", "seem", None,
              [("does not seem", "do not seem", 1, 1), ("doesn't seem", "don't seem", 1, 1),
               ("never seems", "never seem", 0, 1)], 0),
    "turned out to be": ("past", "turned out to be", "turned out to be", None,
                         [("turned out to be far from", "turned out to be far from", 0, 0),
                          ("turned out to be anything but", "turned out to be anything but",
                           0, 0),
                          ("did not turn out to be", "did not turn out to be", 1, 1)], 1),
    "tasted": ("past", "tasted", "tasted", {"food"},
               [("did not taste", "did not taste", 1, 0), ("didn't taste", "didn't taste", 1, 0),
                ("never tasted", "never tasted", 0, 0)], 0),
    "tastes": ("present", "tastes", "taste", {"food"},
               [("does not taste", "do not taste", 1, 0),
                ("doesn't taste", "don't taste", 1, 0)], 0),
}
# Relative weights of verbs in plain/negated sentences.
VERB_WEIGHT = {"was": 5, "is": 3, "felt": 1, "feels": 0.5, "seemed": 1.2, "seems": 0.6,
               "turned out to be": 0.8, "tasted": 1.5, "tastes": 0.8}
NO_TASTE = {"cold"}  # "the soup tasted cold" reads oddly

INT_GRADABLE = ["really", "very", "quite", "so", "pretty", "incredibly", "truly", "rather",
                "extremely"]
INT_EXTREME = ["really", "truly", "absolutely", "simply"]
INT_PHRASE = ["really", "truly", "definitely"]
PHRASE_PAST_ONLY = {"a pleasant surprise", "a real treat", "a letdown", "a disappointment"}

# Predicate phrases: (text, polarity, negatable, kinds)
_PH_KINDS = {"film", "device", "software", "wear", "food", "experience", "place"}
PHRASES = [
    ("worth it", 1, 1, _PH_KINDS), ("worth the money", 1, 1, _PH_KINDS),
    ("worth the wait", 1, 1, {"film", "food", "experience", "device"}),
    ("worth every penny", 1, 1, _PH_KINDS), ("well worth it", 1, 0, _PH_KINDS),
    ("money well spent", 1, 1, {"device", "software", "wear", "experience", "food"}),
    ("a pleasant surprise", 1, 1, _PH_KINDS), ("a real treat", 1, 1,
                                               {"film", "food", "experience"}),
    ("a joy to watch", 1, 1, {"film"}), ("a great deal", 1, 1, {"device", "wear", "software"}),
    ("a waste of money", 0, 1, _PH_KINDS), ("a waste of time", 0, 1,
                                            {"film", "experience", "software"}),
    ("a letdown", 0, 1, _PH_KINDS), ("a disappointment", 0, 1, _PH_KINDS),
    ("a rip-off", 0, 1, {"device", "wear", "food", "place", "software"}),
    ("a mess", 0, 1, {"film", "software", "experience"}),
    ("a chore to sit through", 0, 1, {"film"}),
]

# Comparatives for "could (not) have been X": kind -> (positive, negative)
COMPARATIVES = {
    "film": ("better|funnier|more exciting", "worse|more boring|duller"),
    "story": ("better|more original", "worse|more predictable"),
    "acting": ("better|more convincing", "worse|stiffer"),
    "music": ("better", "worse"),
    "device": ("better|faster|more reliable", "worse|slower|flimsier"),
    "software": ("better|faster|more reliable", "worse|slower|buggier"),
    "screen": ("better|brighter|sharper", "worse|dimmer"),
    "battery": ("better", "worse"),
    "wear": ("better|more comfortable", "worse|less comfortable"),
    "food": ("better|tastier|fresher", "worse|blander|saltier"),
    "service": ("better|faster|friendlier|more helpful", "worse|slower|ruder"),
    "person": ("nicer|friendlier|more helpful|kinder|more attentive", "ruder|slower|worse"),
    "place": ("better|cleaner|quieter|nicer|more comfortable", "worse|dirtier|noisier"),
    "experience": ("better|nicer|more relaxing", "worse|more stressful"),
    "price": ("lower|better", "higher"),
    "bill": ("lower|smaller", "higher|bigger"),
    "portion": ("bigger|more generous", "smaller"),
}

# Two subjects of these kinds in one sentence would talk about the same thing twice
ONE_TOPIC_KINDS = {"price", "bill", "portion", "battery", "screen", "service", "film"}
# "more boring than funny" reads naturally only for these kinds
MORE_THAN_KINDS = {"film", "story", "experience", "acting"}
# First-person templates: "I loved X" / "I would recommend X" only for these kinds
LIKE_KINDS = {"film", "story", "acting", "music", "device", "software", "wear", "food",
              "place", "experience", "screen"}
RECOMMEND_KINDS = {"film", "device", "software", "wear", "food", "place", "experience"}
RECOMMEND_PREFIXES = ("I would", "I can't", "I would not", "I would never")

GERUND = {"film": "watching", "device": "buying", "software": "buying", "wear": "buying",
          "food": "ordering", "place": "booking", "experience": "booking"}

NON_PERSON = [k for k in SUBJECTS if k != "person"]


def pol_of(kind, adj):
    for lex in (CORE, FULL):
        if kind in lex.adj:
            pos, neg = lex.adj[kind]
            if adj in pos.split():
                return 1
            if adj in neg.split():
                return 0
    raise KeyError((kind, adj))


def subj_by_text(text, lex=None):
    for kind, subs in (lex or CORE).subjects.items():
        for s, pl in subs:
            if s == text:
                return (s, pl, kind)
    raise KeyError(text)


def pronoun(subj):
    return ("they", "were") if subj[1] else ("it", "was")


def strip_det(s):
    for d in ("the ", "this ", "these ", "our "):
        if s.startswith(d):
            return s[len(d):]
    return s


def a_an(word):
    return "an" if word[0] in "aeiou" and not word.startswith(("use", "uni")) else "a"


# ---------------------------------------------------------------------------------------
# Sentence templates.  Each returns (text, label); all parameters are explicit so that the
# self-checks below can build hand-picked sentences.
# ---------------------------------------------------------------------------------------

def verb_form(vid, subj):
    v = VERBS[vid]
    return v[2] if subj[1] else v[1]


def neg_form(vid, idx, subj):
    n = VERBS[vid][4][idx]
    return n[1] if subj[1] else n[0]


def clause_plain(subj, vid, intens, adj):
    parts = [subj[0], verb_form(vid, subj)] + ([intens] if intens else []) + [adj]
    return " ".join(parts), pol_of(subj[2], adj)


def clause_neg(subj, vid, nidx, adj, at_all):
    text = "%s %s %s" % (subj[0], neg_form(vid, nidx, subj), adj)
    if at_all:
        text += " at all"
    return text, 1 - pol_of(subj[2], adj)


def phrase_pol(ph):
    for t, p, _, _ in PHRASES:
        if t == ph:
            return p
    raise KeyError(ph)


def t_phrase(subj, vid, intens, ph):
    parts = [subj[0], verb_form(vid, subj)] + ([intens] if intens else []) + [ph]
    return " ".join(parts), phrase_pol(ph)


def t_phrase_neg(subj, vid, nidx, ph):
    return "%s %s %s" % (subj[0], neg_form(vid, nidx, subj), ph), 1 - phrase_pol(ph)


def t_and(c1, c2):
    assert c1[1] == c2[1]
    return "%s and %s" % (c1[0], c2[0]), c1[1]


def t_and_same(subj, vid, a1, a2):
    assert pol_of(subj[2], a1) == pol_of(subj[2], a2)
    return "%s %s %s and %s" % (subj[0], verb_form(vid, subj), a1, a2), pol_of(subj[2], a1)


FIRST_PERSON_POS = ["I loved", "I love", "I really enjoyed", "I enjoyed", "I liked", "I like",
                    "I really liked", "we loved", "we enjoyed", "I would recommend",
                    "I would happily recommend"]
FIRST_PERSON_NEG = ["I hated", "I hate", "I disliked", "I really disliked", "we hated",
                    "I would avoid", "I would stay away from"]
FIRST_PERSON_NEGATED = [  # (prefix, label): the object follows
    ("I did not like", 0), ("I didn't like", 0), ("I don't like", 0), ("I never liked", 0),
    ("I did not enjoy", 0), ("I didn't enjoy", 0), ("I never enjoyed", 0),
    ("I did not love", 0), ("we did not enjoy", 0), ("I do not love", 0),
    ("I would not recommend", 0), ("I would never recommend", 0), ("I can't recommend", 0),
    ("I did not hate", 1), ("I didn't hate", 1), ("I don't hate", 1), ("I did not dislike", 1),
    ("I would not avoid", 1),
]


def t_first(prefix, subj, suffix=""):
    if prefix in FIRST_PERSON_POS:
        label = 1
    elif prefix in FIRST_PERSON_NEG:
        label = 0
    else:
        label = dict(FIRST_PERSON_NEGATED)[prefix]
    if suffix == " enough":
        assert prefix == "I can't recommend"
        label = 1
    return "%s %s%s" % (prefix, subj[0], suffix), label


def t_regret(neg, subj):
    g = GERUND[subj[2]]
    if neg:
        return "I do%s regret %s %s" % (neg, g, subj[0]), 1
    return "I regret %s %s" % (g, subj[0]), 0


def t_what(adj, subj):
    noun = strip_det(subj[0])
    return "what %s %s %s" % (a_an(adj), adj, noun), pol_of(subj[2], adj)


def t_nothing(form, subj, adj):
    if form == 0:
        text = "nothing about %s was %s" % (subj[0], adj)
    elif form == 1:
        text = "there was nothing %s about %s" % (adj, subj[0])
    elif form == 2:
        text = "no one could call %s %s" % (subj[0], adj)
    else:
        text = "there was not one %s thing about %s" % (adj, subj[0])
    return text, 1 - pol_of(subj[2], adj)


def t_could(subj, neg, comp, comp_pol):
    # "could have been better" -> 0; "could not have been better" -> 1;
    # "could not have been worse" -> 0.  ("could have been worse" is never generated.)
    if not neg:
        assert comp_pol == 1
        return "%s could have been %s" % (subj[0], comp), 0
    return "%s %s have been %s" % (subj[0], neg, comp), comp_pol


CONNECTORS = ["but", ", but", "yet", ", yet", "although", ", although", "though", ", though",
              "even though", ", even though", "while", ", and yet"]


def t_contrast(conn, c_other, c_decide):
    """Joins two clauses of opposite polarity; the main clause decides the label."""
    assert c_other[1] != c_decide[1]
    if conn in ("but", ", but", "yet", ", yet", ", and yet"):
        sep = " " if conn[0] != "," else ""
        return "%s%s%s %s" % (c_other[0], sep, conn, c_decide[0]), c_decide[1]
    if conn in ("although", "though", "even though", "while"):       # subordinate first
        return "%s %s, %s" % (conn, c_other[0], c_decide[0]), c_decide[1]
    if conn in (", although", ", though", ", even though"):        # main clause first
        return "%s%s %s" % (c_decide[0], conn, c_other[0]), c_decide[1]
    raise ValueError(conn)


def t_pair(form, subj, vid, a1, a2):
    """Same subject, two opposite adjectives; a1 is the asserted one."""
    k = subj[2]
    assert pol_of(k, a1) != pol_of(k, a2)
    v = verb_form(vid, subj)
    if form == 0:
        text = "%s %s %s, not %s" % (subj[0], v, a1, a2)
    elif form == 1:
        text = "%s %s %s rather than %s" % (subj[0], v, a1, a2)
    elif form == 2:
        text = "%s %s more %s than %s" % (subj[0], v, a1, a2)
    else:
        text = "%s %s %s and not at all %s" % (subj[0], v, a1, a2)
    return text, pol_of(k, a1)


def t_expect(form, subj, adj, adj2=None):
    pr, be = pronoun(subj)
    p = pol_of(subj[2], adj)
    if form == 0:
        return "I expected %s to be %s, and %s %s" % (subj[0], adj, pr, be), p
    if form == 1:
        return "I expected %s to be %s, but %s %s not" % (subj[0], adj, pr, be), 1 - p
    if form == 2:
        return "I thought %s would be %s, and %s %s" % (subj[0], adj, pr, be), p
    if form == 3:
        return "I thought %s would be %s, but %s %sn't" % (subj[0], adj, pr, be), 1 - p
    if form == 4:
        assert pol_of(subj[2], adj2) != p
        return "I expected %s to be %s, but %s %s %s" % (subj[0], adj, pr, be, adj2), 1 - p
    if form == 5:
        assert pol_of(subj[2], adj2) != p
        return "I thought %s would be %s, but %s %s %s" % (subj[0], adj, pr, be, adj2), 1 - p
    raise ValueError(form)


HEARSAY = {"everyone said": "they were", "my friends said": "they were",
           "the reviews said": "they were", "people said": "they were",
           "my sister said": "she was", "my brother said": "he was", "critics said": "they were"}


def t_hearsay(who, form, subj, adj, adj2=None):
    pr, be = pronoun(subj)
    p = pol_of(subj[2], adj)
    head = "%s %s %s %s" % (who, subj[0], "were" if subj[1] else "was", adj)
    if form == 0:
        return head + ", and %s right" % HEARSAY[who], p
    if form == 1:
        return head + ", and %s wrong" % HEARSAY[who], 1 - p
    if form == 2:
        assert pol_of(subj[2], adj2) != p
        return "%s, but %s %s %s" % (head, pr, be, adj2), 1 - p
    if form == 3:
        return head + ", and I agree", p
    if form == 4:
        return head + ", but I disagree", 1 - p
    if form == 5:
        assert pol_of(subj[2], adj2) != p
        return "%s, but I found %s %s" % (head, "them" if subj[1] else "it", adj2), 1 - p
    raise ValueError(form)


# ---------------------------------------------------------------------------------------
# Lexicons
# ---------------------------------------------------------------------------------------

class Lexicon:
    """The word lists and template choices one generator draws from.  FULL (the tables above)
    feeds the tinytext reviews; CORE (below) is the small lexicon of the sentiment set."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def adjs(self, kind, pol=None, negatable=False):
        pos, neg = self.adj[kind]
        out = []
        if pol in (None, 1):
            out += pos.split()
        if pol in (None, 0):
            out += [a for a in neg.split() if not (negatable and a in NOT_NEGATABLE)]
        return out


FULL = Lexicon(
    adj=ADJ, antonyms=ANTONYMS, generic_pos=GENERIC_POS, generic_neg=GENERIC_NEG,
    generic_pair_p=0.3, no_more=NO_MORE, subjects=SUBJECTS, domains=DOMAINS,
    kind_w={"film": 3, "food": 3, "device": 2, "service": 2, "person": 2, "place": 2,
            "experience": 2, "story": 2, "acting": 1.5},
    verb_weight=VERB_WEIGHT, neg_weight=None,
    int_gradable=INT_GRADABLE, int_extreme=INT_EXTREME, int_phrase=INT_PHRASE,
    ph_kinds=_PH_KINDS, phrases=PHRASES, comparatives=COMPARATIVES,
    one_topic_kinds=ONE_TOPIC_KINDS, more_than_kinds=MORE_THAN_KINDS, like_kinds=LIKE_KINDS,
    recommend_kinds=RECOMMEND_KINDS, gerund=GERUND, non_person=NON_PERSON,
    first_pos=FIRST_PERSON_POS, first_neg=FIRST_PERSON_NEG,
    first_negated=FIRST_PERSON_NEGATED, connectors=CONNECTORS, hearsay=list(HEARSAY),
    family_weights=FAMILY_WEIGHTS_FULL, distinct_nouns=False, contrast_neg_p=0.25,
    # cumulative shares of the forms in each family (see Gen.plain, .negated, .contrast)
    plain_cuts=(0.58, 0.70, 0.76, 0.86, 0.93), neg_cuts=(0.55, 0.65, 0.76, 0.88),
    contrast_cuts=(0.42, 0.67, 0.84))

# ---- CORE: the sentiment set's lexicon ------------------------------------------------
# A byte-level model trained from scratch has to learn every word's polarity before it can
# learn composition, so the sentiment set uses few words, most of them shared across kinds:
# 6 positive and 5 negative adjectives for every kind plus at most 2 of each per kind (28
# adjectives in all), 41 subjects, 3 verbs, 3 negators ("not", "n't", "never").  Polarity can
# be told from a word's last bytes: no ending is shared by the two classes ("-ing" and "-ful"
# are negative only, "quite" is not an intensifier next to "quiet").  All the templates
# (negation, "X, not Y", "A but B", expectations, hearsay, first person, "could have been")
# are kept; the harder, rarer forms get a small share (see the *_cuts below).
CORE_POS = "good great excellent nice perfect lovely "
CORE_NEG = "bad awful terrible horrible disappointing "
CORE = Lexicon(
    adj={
        "film": (CORE_POS + "funny", CORE_NEG + "boring dull"),
        "story": (CORE_POS + "clever", CORE_NEG + "boring"),
        "acting": (CORE_POS.strip(), CORE_NEG + "weak"),
        "device": (CORE_POS + "fast", CORE_NEG + "slow"),
        "software": (CORE_POS + "fast", CORE_NEG + "slow"),
        "food": (CORE_POS + "delicious fresh", CORE_NEG + "bland cold"),
        "service": (CORE_POS + "friendly fast", CORE_NEG + "rude slow"),
        "person": (CORE_POS + "friendly", CORE_NEG + "rude"),
        "place": (CORE_POS + "clean quiet", CORE_NEG + "dirty loud"),
        "experience": (CORE_POS.strip(), CORE_NEG + "boring"),
    },
    antonyms={
        "film": "funny/boring funny/dull", "story": "clever/boring",
        "acting": "good/weak", "device": "fast/slow", "software": "fast/slow",
        "food": "delicious/bland fresh/bland", "service": "friendly/rude fast/slow",
        "person": "friendly/rude", "place": "clean/dirty quiet/loud",
        "experience": "nice/boring",
    },
    generic_pos=set("good great excellent nice lovely".split()),
    generic_neg=set(CORE_NEG.split()),
    generic_pair_p=0.5,
    no_more=NO_MORE | set("nice clean quiet fresh rude loud lovely perfect".split()),
    subjects={
        "film": _subj("the movie, the film, this movie, the show, the sequel"),
        "story": _subj("the plot, the story, the ending, the script"),
        "acting": _subj("the acting, the cast, the actors*"),
        "device": _subj("this phone, the phone, the laptop, the camera, the printer"),
        "software": _subj("the app, this app, the software, the game"),
        "food": _subj("the food, the pasta, the soup, the pizza, the fries*, the dessert"),
        "service": _subj("the service, the staff"),
        "person": _subj("our waiter, the waiter, the host, the manager"),
        "place": _subj("the hotel, the room, the place, the cafe"),
        "experience": _subj("the trip, the stay, the evening, the visit"),
    },
    domains={"movie": ["film", "story", "acting"], "gadget": ["device", "software"],
             "restaurant": ["food", "service", "person", "place", "experience"],
             "hotel": ["place", "service", "person", "experience"]},
    kind_w={"film": 3, "food": 3, "device": 2, "service": 2, "person": 2, "place": 2,
            "experience": 2, "story": 2, "acting": 1.5},
    verb_weight={"was": 5, "is": 3, "felt": 0, "feels": 0, "seemed": 0.5, "seems": 0,
                 "turned out to be": 0, "tasted": 0, "tastes": 0},
    # "not" / "n't" (3:1 against "never"); "hardly", "far from", ... are not used
    neg_weight=lambda n: 3 if ("not" in n or "n't" in n) else 1 if "never" in n else 0,
    int_gradable=["really", "very", "so", "pretty"],
    int_extreme=["really", "truly", "absolutely"], int_phrase=["really"],
    ph_kinds={"film", "device", "software", "food", "experience", "place"},
    phrases=[p for p in PHRASES if p[0] in ("worth it", "worth the money", "a waste of money",
                                            "a waste of time", "a letdown",
                                            "a pleasant surprise")],
    comparatives={
        "film": ("better|funnier", "worse|more boring"), "story": ("better", "worse"),
        "acting": ("better", "worse"), "device": ("better|faster", "worse|slower"),
        "software": ("better|faster", "worse|slower"), "food": ("better|fresher", "worse"),
        "service": ("better|faster|friendlier", "worse|slower|ruder"),
        "person": ("nicer|friendlier", "ruder|worse"),
        "place": ("better|cleaner|quieter", "worse|dirtier|louder"),
        "experience": ("better|nicer", "worse"),
    },
    one_topic_kinds={"service", "film"}, more_than_kinds=MORE_THAN_KINDS,
    like_kinds={"film", "story", "acting", "device", "software", "food", "place",
                "experience"},
    recommend_kinds={"film", "device", "software", "food", "place", "experience"},
    gerund={"film": "watching", "device": "buying", "software": "buying", "food": "ordering",
            "place": "booking", "experience": "booking"},
    non_person=["film", "story", "acting", "device", "software", "food", "service", "place",
                "experience"],
    first_pos=["I loved", "I enjoyed", "I liked", "we loved", "I would recommend"],
    first_neg=["I hated", "I disliked", "I would avoid"],
    first_negated=[("I did not like", 0), ("I didn't like", 0), ("I didn't enjoy", 0),
                   ("I would not recommend", 0), ("I can't recommend", 0),
                   ("I did not hate", 1), ("I didn't hate", 1), ("I don't hate", 1)],
    connectors=["but", ", but", "although", ", although"],
    hearsay=["everyone said", "my friends said", "the reviews said", "critics said"],
    family_weights=FAMILY_WEIGHTS,
    distinct_nouns=True,     # not "the app was slow and this app was bad"
    contrast_neg_p=0.0,      # "A but B" joins plain clauses: one step of composition at a time
    # plain: one clause 70%, "A and B" 15%, "X was A and B" 3%, first person 4%, "what a" 4%,
    # phrase 4%; negated: one clause 80%, phrase 5%, first person 5%, "nothing" 6%, "could" 4%;
    # contrast: "A but B" 55%, "X, not Y" and co. 30%, expectations 8%, hearsay 7%
    plain_cuts=(0.70, 0.85, 0.88, 0.92, 0.96), neg_cuts=(0.80, 0.85, 0.90, 0.96),
    contrast_cuts=(0.55, 0.85, 0.93))


# ---------------------------------------------------------------------------------------
# Random sampling on top of the templates
# ---------------------------------------------------------------------------------------

class Retry(Exception):
    pass


class Gen:
    def __init__(self, rng, allowed=None, subjects=None, lex=FULL):
        self.r = rng
        self.L = lex
        self.allowed = set(allowed or lex.subjects)
        self.subjects = dict(lex.subjects, **(subjects or {}))
        self.kinds = [k for k in lex.subjects if k in self.allowed]
        # person/service/food/film are the most common review topics
        self.kind_w = [lex.kind_w.get(k, 1) for k in self.kinds]

    def kind(self, pool=None):
        if pool is None:
            return self.r.choices(self.kinds, self.kind_w)[0]
        pool = [k for k in pool if k in self.allowed]
        if not pool:
            raise Retry
        return self.r.choice(pool)

    def subj(self, kind):
        s, pl = self.r.choice(self.subjects[kind])
        return (s, pl, kind)

    def verb(self, kind, tense=None, phrase=False, adj=None):
        cands = []
        for vid, v in VERBS.items():
            if v[3] is not None and kind not in v[3]:
                continue
            if tense and v[0] != tense:
                continue
            if phrase and not v[5]:
                continue
            if adj in NO_TASTE and vid in ("tasted", "tastes"):
                continue
            cands.append(vid)
        return self.r.choices(cands, [self.L.verb_weight[c] for c in cands])[0]

    def intens(self, adj):
        if self.r.random() < 0.45:
            return ""
        return self.r.choice(self.L.int_extreme if adj in EXTREME else self.L.int_gradable)

    def plain_clause(self, subj, pol, tense=None, short=False):
        adj = self.r.choice(self.L.adjs(subj[2], pol))
        vid = self.verb(subj[2], tense, adj=adj)
        it = "" if short and self.r.random() < 0.7 else self.intens(adj)
        return clause_plain(subj, vid, it, adj)

    def neg_clause(self, subj, label, tense=None):
        adj = self.r.choice(self.L.adjs(subj[2], 1 - label, negatable=True))
        vid = self.verb(subj[2], tense, adj=adj)
        nidx = self.neg_index(vid)
        at_all = VERBS[vid][4][nidx][2] and self.r.random() < 0.25
        return clause_neg(subj, vid, nidx, adj, at_all)

    def neg_index(self, vid, ok=None):
        ok = range(len(VERBS[vid][4])) if ok is None else ok
        if self.L.neg_weight is None:
            return self.r.choice(ok) if isinstance(ok, list) else self.r.randrange(len(ok))
        return self.r.choices(list(ok), [self.L.neg_weight(VERBS[vid][4][i][0]) for i in ok])[0]

    def phrase_verb(self, kind, ph):
        while True:
            vid = self.verb(kind, phrase=True)
            if not (ph in PHRASE_PAST_ONLY and VERBS[vid][0] != "past"):
                return vid

    def first_person(self, prefixes):
        p = self.r.choice(prefixes)
        kinds = self.L.recommend_kinds if p.startswith(RECOMMEND_PREFIXES) else self.L.like_kinds
        return p, self.subj(self.kind(sorted(kinds)))

    def phrase(self, kind, pol, negatable=False):
        c = [p for p in self.L.phrases if kind in p[3] and p[1] == pol and (p[2] or not negatable)]
        return self.r.choice(c)[0] if c else None

    # ---- families -------------------------------------------------------------------
    def plain(self, label):
        r = self.r.random()
        if r < self.L.plain_cuts[0]:
            s = self.subj(self.kind())
            return self.plain_clause(s, label), "plain"
        if r < self.L.plain_cuts[1]:
            dom = self.r.choice(list(self.L.domains))
            k1, k2 = self.kind(self.L.domains[dom]), self.kind(self.L.domains[dom])
            s1, s2 = self.subj(k1), self.subj(k2)
            if s1[0] == s2[0] or (s1[2] == s2[2] and s1[2] in self.L.one_topic_kinds) \
                    or (self.L.distinct_nouns and strip_det(s1[0]) == strip_det(s2[0])):
                return None
            tense = self.r.choice(["past", "past", "present"])
            return t_and(self.plain_clause(s1, label, tense, True),
                         self.plain_clause(s2, label, tense, True)), "plain-and"
        if r < self.L.plain_cuts[2]:
            s = self.subj(self.kind())
            a1, a2 = self.r.sample(self.L.adjs(s[2], label), 2)
            return t_and_same(s, self.r.choice(["was", "is"]), a1, a2), "plain-and"
        if r < self.L.plain_cuts[3]:
            if label == 1:
                return t_first(*self.first_person(self.L.first_pos)), "plain-first"
            if self.r.random() < 0.3:
                return t_regret("", self.subj(self.kind(sorted(self.L.gerund)))), "plain-first"
            return t_first(*self.first_person(self.L.first_neg)), "plain-first"
        if r < self.L.plain_cuts[4]:
            s = self.subj(self.kind())
            if s[1]:
                return None
            return t_what(self.r.choice(self.L.adjs(s[2], label)), s), "plain-what"
        s = self.subj(self.kind(sorted(self.L.ph_kinds)))
        ph = self.phrase(s[2], label)
        if ph is None:
            return None
        it = self.r.choice(self.L.int_phrase) if self.r.random() < 0.4 and ph != "well worth it" \
            else ""
        return t_phrase(s, self.phrase_verb(s[2], ph), it, ph), "plain-phrase"

    def negated(self, label):
        r = self.r.random()
        if r < self.L.neg_cuts[0]:
            s = self.subj(self.kind())
            return self.neg_clause(s, label), "neg"
        if r < self.L.neg_cuts[1]:
            s = self.subj(self.kind(sorted(self.L.ph_kinds)))
            ph = self.phrase(s[2], 1 - label, negatable=True)
            if ph is None:
                return None
            vid = self.phrase_verb(s[2], ph)
            ok = [i for i, n in enumerate(VERBS[vid][4]) if n[3]]
            return t_phrase_neg(s, vid, self.neg_index(vid, ok), ph), "neg-phrase"
        if r < self.L.neg_cuts[2]:
            if label == 1 and self.r.random() < 0.3:
                s = self.subj(self.kind(sorted(self.L.gerund)))
                return t_regret(self.r.choice([" not", "n't"]), s), "neg-first"
            if label == 1 and self.r.random() < 0.2:
                s = self.subj(self.kind(sorted(self.L.recommend_kinds)))
                return t_first("I can't recommend", s, " enough"), "neg-first"
            c = [p for p, l in self.L.first_negated if l == label]
            return t_first(*self.first_person(c)), "neg-first"
        if r < self.L.neg_cuts[3]:
            s = self.subj(self.kind())
            adj = self.r.choice(self.L.adjs(s[2], 1 - label, negatable=True))
            return t_nothing(self.r.randrange(4), s, adj), "neg-nothing"
        s = self.subj(self.kind())
        pos, neg = (x.split("|") for x in self.L.comparatives[s[2]])
        modal = self.r.choice(["could not", "couldn't"])
        if label == 1:
            return t_could(s, modal, self.r.choice(pos), 1), "neg-could"
        if self.r.random() < 0.5:
            return t_could(s, "", self.r.choice(pos), 1), "neg-could"
        return t_could(s, modal, self.r.choice(neg), 0), "neg-could"

    def contrast(self, label):
        r = self.r.random()
        if r < self.L.contrast_cuts[0]:
            dom = self.r.choice(list(self.L.domains))
            s1, s2 = (self.subj(self.kind(self.L.domains[dom])),
                      self.subj(self.kind(self.L.domains[dom])))
            if s1[0] == s2[0] or (s1[2] == s2[2] and s1[2] in self.L.one_topic_kinds) \
                    or (self.L.distinct_nouns and strip_det(s1[0]) == strip_det(s2[0])):
                return None
            tense = self.r.choice(["past", "past", "past", "present"])
            cl = []
            for s, pol in ((s1, 1 - label), (s2, label)):
                if self.r.random() < self.L.contrast_neg_p:
                    cl.append(self.neg_clause(s, pol, tense))
                else:
                    cl.append(self.plain_clause(s, pol, tense, True))
            return t_contrast(self.r.choice(self.L.connectors), cl[0], cl[1]), "contrast-but"
        if r < self.L.contrast_cuts[1]:
            s = self.subj(self.kind())
            form = self.r.choice([0, 0, 1, 2, 3])
            if self.r.random() < 1 - self.L.generic_pair_p:
                ap, an = self.r.choice(self.L.antonyms[s[2]].split()).split("/")
            else:
                ap = self.r.choice(sorted(self.L.generic_pos & set(self.L.adjs(s[2], 1)))
                                   or [None])
                an = self.r.choice(sorted(self.L.generic_neg & set(self.L.adjs(s[2], 0)))
                                   or [None])
                if ap is None or an is None:
                    return None
            a1, a2 = (ap, an) if label == 1 else (an, ap)
            if form == 3:   # "fresh and not at all bland": not antonyms, that reads redundant
                a1 = self.r.choice(self.L.adjs(s[2], label))
                a2 = self.r.choice([a for a in self.L.adjs(s[2], 1 - label)
                                    if a not in EXTREME])
                if "%s/%s" % ((a1, a2) if label else (a2, a1)) in self.L.antonyms[s[2]].split():
                    return None
            if form == 2 and (s[2] not in self.L.more_than_kinds
                              or {a1, a2} & (self.L.no_more | EXTREME)):
                form = 0
            vid = self.r.choice(["was", "was", "is"] + (["seemed"] if form < 2 else []))
            return t_pair(form, s, vid, a1, a2), "contrast-pair"
        if r < self.L.contrast_cuts[2]:
            s = self.subj(self.kind(self.L.non_person))
            form = self.r.randrange(6)
            if form in (0, 2):
                adj = self.r.choice(self.L.adjs(s[2], label))
                return t_expect(form, s, adj), "contrast-expect"
            if form in (1, 3):
                adj = self.r.choice(self.L.adjs(s[2], 1 - label, negatable=True))
                return t_expect(form, s, adj), "contrast-expect"
            adj = self.r.choice(self.L.adjs(s[2], 1 - label))
            adj2 = self.r.choice(self.L.adjs(s[2], label))
            return t_expect(form, s, adj, adj2), "contrast-expect"
        s = self.subj(self.kind(self.L.non_person))
        who = self.r.choice(self.L.hearsay)
        form = self.r.randrange(6)
        if form in (0, 3):
            adj = self.r.choice(self.L.adjs(s[2], label))
            return t_hearsay(who, form, s, adj), "contrast-said"
        if form in (1, 4):
            adj = self.r.choice(self.L.adjs(s[2], 1 - label, negatable=True))
            return t_hearsay(who, form, s, adj), "contrast-said"
        adj = self.r.choice(self.L.adjs(s[2], 1 - label))
        adj2 = self.r.choice(self.L.adjs(s[2], label))
        return t_hearsay(who, form, s, adj, adj2), "contrast-said"

    def example(self, label):
        fams = [f for f, _ in self.L.family_weights]
        fam = self.r.choices(fams, [w for _, w in self.L.family_weights])[0]
        while True:
            try:
                out = getattr(self, fam)(label)
            except Retry:
                continue
            if out is None:
                continue
            (text, lab), sub = out
            assert lab == label, (text, lab, label)
            text = self.surface(text)
            if len(text.encode()) <= MAX_TEXT_BYTES:
                return text, lab, sub

    def surface(self, text):
        if self.r.random() < 0.5:
            text = text[0].upper() + text[1:]
        x = self.r.random()
        if x < 0.55:
            text += "."
        elif x < 0.60:
            text += "!"
        return text


def norm(text):
    return text.lower().rstrip(".!")


def gen_sentiment(seed):
    rng = random.Random(seed)
    g = Gen(rng, lex=CORE)
    # One pool of distinct sentences (half of each label), then a random split: train and val
    # follow the same distribution (drawing val after train would make it harder, since the
    # short forms are the first to run out of new sentences).
    seen = set()
    pool = ([], [])
    for i in range(N_TRAIN + N_VAL):
        label = i % 2
        while True:
            text, lab, sub = g.example(label)
            k = norm(text)
            if k not in seen:
                seen.add(k)
                pool[label].append((lab, text, sub))
                break
    train, val = [], []
    for rows in pool:
        rng.shuffle(rows)
        val += rows[:N_VAL // 2]
        train += rows[N_VAL // 2:]
    rng.shuffle(train)
    rng.shuffle(val)
    return train, val


# ---------------------------------------------------------------------------------------
# Self-checks on hand-picked sentences
# ---------------------------------------------------------------------------------------

def self_check():
    food, phone = subj_by_text("the food"), subj_by_text("this phone")
    movie, acting, story = (subj_by_text("the movie"), subj_by_text("the acting"),
                            subj_by_text("the story"))
    waiter, room = subj_by_text("our waiter"), subj_by_text("the room")
    fries = subj_by_text("the fries")
    i_not = [n[0] for n in VERBS["was"][4]]
    cases = [
        (clause_plain(food, "was", "", "good"), ("the food was good", 1)),
        (clause_plain(food, "was", "really", "bland"), ("the food was really bland", 0)),
        (clause_neg(food, "was", i_not.index("was not"), "good", 0), ("the food was not good", 0)),
        (clause_neg(movie, "was", i_not.index("was never"), "boring", 0),
         ("the movie was never boring", 1)),
        (clause_neg(fries, "was", i_not.index("wasn't"), "cold", 1),
         ("the fries weren't cold at all", 1)),
        (clause_neg(room, "seemed", 0, "clean", 0), ("the room did not seem clean", 0)),
        (t_phrase_neg(phone, "was", i_not.index("wasn't"), "worth it"),
         ("this phone wasn't worth it", 0)),
        (t_phrase_neg(movie, "was", i_not.index("was not"), "a waste of time"),
         ("the movie was not a waste of time", 1)),
        (t_pair(0, movie, "was", "good", "bad"), ("the movie was good, not bad", 1)),
        (t_pair(0, movie, "was", "bad", "good"), ("the movie was bad, not good", 0)),
        (t_pair(2, movie, "was", "boring", "funny"), ("the movie was more boring than funny", 0)),
        (t_pair(3, room, "was", "clean", "loud"),
         ("the room was clean and not at all loud", 1)),
        (t_pair(1, waiter, "was", "rude", "friendly"),
         ("our waiter was rude rather than friendly", 0)),
        (t_contrast("but", clause_plain(acting, "was", "", "weak"),
                    clause_plain(story, "was", "", "great")),
         ("the acting was weak but the story was great", 1)),
        (t_contrast("but", clause_plain(story, "was", "", "great"),
                    clause_plain(acting, "was", "", "weak")),
         ("the story was great but the acting was weak", 0)),
        (t_contrast("although", clause_plain(food, "was", "", "cold"),
                    clause_plain(waiter, "was", "", "friendly")),
         ("although the food was cold, our waiter was friendly", 1)),
        (t_contrast(", although", clause_plain(food, "was", "", "cold"),
                    clause_plain(waiter, "was", "", "friendly")),
         ("our waiter was friendly, although the food was cold", 1)),
        (t_contrast(", although", clause_plain(waiter, "was", "", "friendly"),
                    clause_plain(food, "was", "", "cold")),
         ("the food was cold, although our waiter was friendly", 0)),
        (t_contrast("but", clause_neg(food, "was", 0, "great", 0),
                    clause_plain(waiter, "was", "", "friendly")),
         ("the food was not great but our waiter was friendly", 1)),
        (t_could(waiter, "", "friendlier", 1), ("our waiter could have been friendlier", 0)),
        (t_could(waiter, "could not", "friendlier", 1),
         ("our waiter could not have been friendlier", 1)),
        (t_could(food, "could not", "worse", 0), ("the food could not have been worse", 0)),
        (t_nothing(1, movie, "boring"), ("there was nothing boring about the movie", 1)),
        (t_nothing(0, food, "good"), ("nothing about the food was good", 0)),
        (t_expect(1, movie, "boring"), ("I expected the movie to be boring, but it was not", 1)),
        (t_expect(0, movie, "boring"), ("I expected the movie to be boring, and it was", 0)),
        (t_expect(3, fries, "fresh"), ("I thought the fries would be fresh, but they weren't", 0)),
        (t_hearsay("everyone said", 1, movie, "boring"),
         ("everyone said the movie was boring, and they were wrong", 1)),
        (t_hearsay("critics said", 5, movie, "funny", "dull"),
         ("critics said the movie was funny, but I found it dull", 0)),
        (t_hearsay("everyone said", 4, phone, "slow"),
         ("everyone said this phone was slow, but I disagree", 1)),
        (t_first("I can't recommend", phone, " enough"), ("I can't recommend this phone enough", 1)),
        (t_first("I can't recommend", phone), ("I can't recommend this phone", 0)),
        (t_first("I did not hate", movie), ("I did not hate the movie", 1)),
        (t_regret(" not", phone), ("I do not regret buying this phone", 1)),
        (t_what("awful", movie), ("what an awful movie", 0)),
    ]
    for got, want in cases:
        assert got == want, (got, want)
    # Every adjective of a kind is usable in both classes (no adjective is a label giveaway
    # by construction): negatable ones via negation, the rest via contrast forms.
    polarity = {}
    for lex in (CORE, FULL):
        for kind, (pos, neg) in lex.adj.items():
            assert not set(pos.split()) & set(neg.split()), kind
            for pol, words in ((1, pos), (0, neg)):
                for w in words.split():   # one polarity per word, in every kind and lexicon
                    assert polarity.setdefault(w, pol) == pol, (kind, w)
            for pair in lex.antonyms[kind].split():
                ap, an = pair.split("/")
                assert ap in pos.split() and an in neg.split(), (kind, pair)
        assert set(lex.subjects) == set(lex.adj) | ({"bill"} if lex is FULL else set())
        for kind in lex.subjects:
            assert kind in lex.antonyms and kind in lex.comparatives, kind
            # negation needs negatable adjectives of both polarities
            assert lex.adjs(kind, 0, negatable=True) and lex.adjs(kind, 1), kind


# ---------------------------------------------------------------------------------------
# Bag-of-words baselines
# ---------------------------------------------------------------------------------------

TOKEN_RE = re.compile(r"[a-z']+")


def toks(text):
    return TOKEN_RE.findall(text.lower())


def bigrams(text):
    t = ["<s>"] + toks(text)
    return t + [a + "_" + b for a, b in zip(t, t[1:])]


def naive_bayes(train, test, feats):
    cnt = [Counter(), Counter()]
    ndoc = [0, 0]
    for lab, text, _ in train:
        ndoc[lab] += 1
        cnt[lab].update(feats(text))
    vocab = set(cnt[0]) | set(cnt[1])
    tot = [sum(c.values()) for c in cnt]
    V = len(vocab)
    correct = 0
    for lab, text, _ in test:
        sc = []
        for c in (0, 1):
            s = math.log(ndoc[c] / len(train))
            for w in feats(text):
                if w in vocab:
                    s += math.log((cnt[c][w] + 1) / (tot[c] + V))
            sc.append(s)
        correct += (1 if sc[1] > sc[0] else 0) == lab
    return correct / len(test)


def logistic(train, test, feats, epochs=8, lr=0.1, l2=1e-4, seed=7):
    rng = random.Random(seed)
    w = {}
    b = 0.0
    data = [(lab, sorted(set(feats(text)))) for lab, text, _ in train]
    for ep in range(epochs):
        rng.shuffle(data)
        for lab, fs in data:
            z = b + sum(w.get(f, 0.0) for f in fs)
            p = 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))
            gr = p - lab
            b -= lr * gr
            for f in fs:
                wf = w.get(f, 0.0)
                w[f] = wf - lr * (gr + l2 * wf)
    correct = 0
    for lab, text, _ in test:
        z = b + sum(w.get(f, 0.0) for f in set(feats(text)))
        correct += (1 if z > 0 else 0) == lab
    return correct / len(test)


# ---------------------------------------------------------------------------------------
# tinytext: prose for byte-level language modelling
# ---------------------------------------------------------------------------------------

NAMES = [("Mara", "she"), ("Tom", "he"), ("Lena", "she"), ("Sam", "he"), ("Priya", "she"),
         ("Jonas", "he"), ("Ada", "she"), ("Felix", "he"), ("Nora", "she"), ("Omar", "he"),
         ("Ruth", "she"), ("Ivan", "he"), ("Grace", "she"), ("Leo", "he"), ("Hana", "she"),
         ("Marcus", "he"), ("Elena", "she"), ("Theo", "he"), ("Zoe", "she"), ("Daniel", "he"),
         ("Yuki", "she"), ("Pablo", "he"), ("Clara", "she"), ("Ben", "he"), ("Amira", "she"),
         ("Oscar", "he"), ("Julia", "she"), ("Hugo", "he"), ("Maya", "she"), ("Arthur", "he")]
SURNAMES = ["Hill", "Novak", "Patel", "Brennan", "Okafor", "Lindqvist", "Moreau", "Tanaka",
            "Garcia", "Fischer", "Kowalski", "Reyes", "Adler", "Quinn", "Sato", "Walsh"]
TOWNS = ["Eastbrook", "Millford", "Harrow Bay", "Oakdale", "Larkspur", "Stonebridge",
         "Westmere", "Fenwick", "Ashton Vale", "Brightwater", "Kingsport", "Redcliff"]
STREETS = ["Mill Lane", "King Street", "Harbor Road", "Elm Avenue", "Church Street",
           "Station Road", "Baker Street", "Orchard Way", "Market Square", "River Walk"]
PLACES = ["market", "library", "bakery", "harbor", "train station", "park", "museum",
          "post office", "bookshop", "hardware store", "old mill", "flower shop", "town hall",
          "swimming pool", "bus stop", "bridge", "pharmacy", "cinema"]
WEATHER = ["cold", "warm", "rainy", "windy", "bright", "foggy", "quiet", "grey", "sunny",
           "humid", "chilly", "stormy"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
PARTS = ["morning", "afternoon", "evening", "night"]
ITEMS = ["apples", "eggs", "candles", "letters", "books", "envelopes", "oranges", "batteries",
         "pencils", "tomatoes", "stamps", "onions", "lemons", "postcards", "screws", "tea bags"]
COLORS = ["red", "blue", "green", "yellow", "brown", "grey", "white", "black", "orange"]
BAGS = ["bag", "basket", "box", "backpack", "suitcase", "paper bag", "tin"]
SMELLS = ["fresh bread", "rain", "coffee", "salt and seaweed", "old paper", "cut grass",
          "wood smoke", "oranges", "engine oil", "soap"]
ACTIVITIES = ["feeding the pigeons", "reading a newspaper", "painting a fence",
              "fixing a bicycle", "waiting for a bus", "walking a small dog",
              "carrying a ladder", "selling flowers", "counting coins", "sweeping the steps"]
FEELINGS = ["tired", "happy", "hungry", "surprised", "relieved", "cheerful", "thoughtful",
            "a little sad", "proud", "nervous"]
# dish -> (main ingredient, second ingredient, method, minutes, serve with)
RECIPES = [
    ("tomato soup", "tomatoes", "onions", "let it simmer", (20, 40), "warm bread"),
    ("vegetable curry", "potatoes", "carrots", "let it simmer", (25, 45), "rice"),
    ("pancakes", "flour", "eggs", "fry them in a little butter", (2, 4), "honey"),
    ("a lemon cake", "flour", "lemons", "bake it", (35, 50), "a cup of tea"),
    ("rice pudding", "rice", "milk", "cook it gently", (30, 50), "stewed apples"),
    ("apple pie", "apples", "butter", "bake it", (40, 55), "cream"),
    ("lentil stew", "lentils", "carrots", "let it simmer", (30, 45), "crusty bread"),
    ("oat biscuits", "oats", "butter", "bake them", (12, 18), "a glass of milk"),
    ("potato salad", "potatoes", "onions", "boil the potatoes", (15, 20), "cold meat"),
]
UNITS = ["cups", "handfuls", "large", "small"]
SPICES = ["salt", "pepper", "cinnamon", "nutmeg", "cumin", "paprika", "thyme"]
BUILDINGS = ["library", "bridge", "school", "swimming pool", "theater", "market hall",
             "clock tower", "train station", "museum", "community center"]
# business -> (kind of review, allowed sentiment kinds)
BUSINESSES = {
    "restaurant": (["The Blue Door", "Rosa's Kitchen", "The Old Anchor", "Green Leaf Cafe",
                    "Golden Dragon", "The Corner Bistro", "Luna Pizza", "Harbor Grill",
                    "Maple House", "The Red Lantern", "Casa Verde", "Sunrise Diner"],
                   ["food", "service", "person", "place", "price", "bill", "portion",
                    "experience"]),
    "hotel": (["the Seaview Hotel", "the Grand Hotel", "the Old Mill Inn", "Harbor House",
               "the Pine Lodge", "the Station Hotel"],
              ["place", "service", "person", "price", "bill", "experience"]),
    "film": (["The Long Winter", "Paper Moons", "The Last Lighthouse", "Night Train",
              "A Quiet Harbor", "The Clockmaker", "Summer of Glass", "Red River Road"],
             ["film", "story", "acting", "music"]),
}
# product -> (subjects, kinds): each product review talks about that product only
PRODUCTS = {
    "a new phone": ("this phone|the phone", ["device", "screen", "battery", "software"]),
    "a cheap laptop": ("this laptop|the laptop", ["device", "screen", "battery", "software"]),
    "a budget tablet": ("this tablet|the tablet", ["device", "screen", "battery"]),
    "a coffee maker": ("the coffee maker|this coffee maker", ["device"]),
    "a robot vacuum": ("the vacuum|this vacuum", ["device", "battery"]),
    "a blender": ("the blender|this blender", ["device"]),
    "wireless headphones": ("these headphones*|the headphones*", ["wear", "battery"]),
    "a desk chair": ("this chair|the chair", ["wear"]),
    "running shoes": ("these shoes*|the shoes*", ["wear"]),
}


def _time(r, morning=False):
    """A clock time ending in "a.m."/"p.m.", which also ends a sentence when it is last."""
    if morning or r.random() < 0.5:
        return "%d:%02d a.m." % (r.randint(6, 11), r.choice([0, 5, 10, 15, 20, 30, 40, 45, 50]))
    return "%d:%02d p.m." % (r.randint(1, 10), r.choice([0, 5, 10, 15, 20, 30, 40, 45, 50]))


def _price(r, lo=1, hi=60):
    return "$%d.%02d" % (r.randint(lo, hi), r.choice([0, 25, 50, 75, 95, 99, 10]))


def _cap(s):
    return s[0].upper() + s[1:]


def _num_word(n):
    w = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
         "ten", "eleven", "twelve"]
    return w[n] if n < len(w) else str(n)


def _possessive(pron):
    return {"she": "her", "he": "his"}[pron]


class Prose:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.gens = {k: Gen(random.Random(seed + 1 + i), allowed=v[1])
                     for i, (k, v) in enumerate(sorted(BUSINESSES.items()))}
        for i, (name, (subs, kinds)) in enumerate(sorted(PRODUCTS.items())):
            main = _subj(subs.replace("|", ","))
            self.gens[name] = Gen(random.Random(seed + 100 + i), allowed=kinds,
                                  subjects={k: main for k in ("device", "wear")})

    def people(self):
        return self.r.sample(NAMES, 2)

    def story(self):
        r = self.r
        (A, pa), (B, pb) = self.people()
        town = r.choice(TOWNS)
        place, other = r.sample(PLACES, 2)
        n = r.randint(2, 12)
        item = r.choice(ITEMS)
        opening = r.choice([
            "On a %s %s %s in %s, %s walked to the %s in %s." % (
                r.choice(WEATHER), r.choice(DAYS), r.choice(PARTS[:3]), r.choice(MONTHS), A,
                place, town),
            "It was %s when %s finally arrived at the %s on %s." % (
                _time(r), A, place, r.choice(STREETS)),
            "%s had lived in %s for %d years, but %s had never been inside the %s." % (
                A, town, r.randint(2, 40), pa, place),
            "Every %s, %s took the long way to the %s, past the %s." % (
                r.choice(DAYS), A, place, other),
        ])
        meet = [
            "Along the way, %s met %s, who was %s." % (pa, B, r.choice(ACTIVITIES)),
            "\"Good %s, %s,\" %s said. \"Have you been to the %s today?\"" % (
                r.choice(PARTS[:3]), B, A, other),
            "\"%s,\" %s replied, %s." % (
                r.choice(["Not yet", "Only for a minute", "Yes, but it was closed again",
                          "I was just there", "No, but I heard it was busy"]), B,
                r.choice(["smiling", "without looking up", "with a shrug", "quietly",
                          "a little too quickly"])),
        ]
        mid = [
            "%s carried a %s %s with %s %s inside." % (_cap(pa), r.choice(COLORS),
                                                      r.choice(BAGS), _num_word(n), item),
            "The %s was %s, and the air smelled of %s." % (
                place, r.choice(["crowded", "almost empty", "warm", "noisy", "very quiet"]),
                r.choice(SMELLS)),
            "%s waited for %d minutes before the %s came back with %s." % (
                A, r.randint(3, 45), r.choice(["clerk", "owner", "baker", "guard", "porter"]),
                r.choice(["the keys", "a small parcel", "two cups of tea", "bad news",
                          "a map of %s" % town])),
            "The %s cost %s, which was %s than %s had expected." % (
                item, _price(r, 1, 9), r.choice(["more", "less"]), A),
            "A sign on the door said: OPEN FROM %d TO %d, EXCEPT ON %s." % (
                r.randint(7, 10), r.randint(4, 8), r.choice(DAYS).upper()),
            "%s counted %d %s and wrote the number in a %s notebook." % (
                A, r.randint(10, 250), r.choice(["steps", "windows", "boats", "birds",
                                                 "people", "cars"]), r.choice(COLORS)),
        ]
        r.shuffle(mid)
        body = mid[:r.randint(1, 3)]
        with_b = r.random() < 0.6
        if with_b:
            body += meet[:r.choice([1, 3])]
            if r.random() < 0.4:
                body.append("It started to %s, so %s and %s stood under the %s for a while." % (
                    r.choice(["rain", "snow", "drizzle"]), A, B,
                    r.choice(["awning", "old oak tree", "bridge", "bus shelter"])))
        endings = [
            "By %s, %s was back home, %s, with %d new %s." % (
                _time(r), A, r.choice(FEELINGS), r.randint(2, 9), r.choice(ITEMS)),
            "%s promised to come back next %s." % (A, r.choice(DAYS)),
            "It was, %s decided, the %s day of the %s." % (
                A, r.choice(["best", "strangest", "longest", "quietest", "happiest"]),
                r.choice(["month", "year", "week"])),
            "Nobody in %s ever found out what was in the %s." % (town, r.choice(BAGS)),
        ]
        if with_b:
            endings.append("On the way home, %s thought about what %s had said, and smiled."
                           % (A, B))
        return " ".join([opening] + body + [r.choice(endings)])

    def review(self):
        r = self.r
        kind = r.choice(["restaurant", "restaurant", "hotel", "film", "product"])
        if kind == "product":
            name = r.choice(sorted(PRODUCTS))
            g = self.gens[name]
        else:
            name = r.choice(BUSINESSES[kind][0])
            g = self.gens[kind]
        if kind == "restaurant":
            head = r.choice([
                "I visited %s on %s last %s with %s friends." % (
                    name, r.choice(STREETS), r.choice(DAYS), _num_word(r.randint(1, 5))),
                "We had dinner at %s in %s on a %s evening." % (name, r.choice(TOWNS),
                                                                r.choice(WEATHER)),
                "Review of %s, written on %s %d, %d." % (
                    name, r.choice(MONTHS), r.randint(1, 28), r.randint(2015, 2024)),
                "My %s and I stopped at %s after a long day in %s." % (
                    r.choice(["brother", "sister", "partner", "mother", "friend"]), name,
                    r.choice(TOWNS)),
            ])
            extra = r.choice([
                "The bill came to %s for %s people." % (_price(r, 20, 140),
                                                        _num_word(r.randint(2, 6))),
                "We waited about %d minutes for a table." % r.randint(5, 50),
                "They open at %s and close at %s" % (
                    "%d:%02d a.m." % (r.randint(7, 11), r.choice([0, 30])),
                    "%d:%02d p.m." % (r.randint(8, 11), r.choice([0, 30]))),
                "Parking was %s." % r.choice(["easy", "a problem", "free after six",
                                              "expensive"]),
            ])
        elif kind == "hotel":
            head = "We stayed at %s in %s for %s nights in %s." % (
                name, r.choice(TOWNS), _num_word(r.randint(2, 9)), r.choice(MONTHS))
            extra = "A double room cost %s a night, breakfast %s." % (
                _price(r, 60, 220), r.choice(["included", "not included", "extra"]))
        elif kind == "film":
            head = r.choice([
                "I saw %s at the cinema in %s last %s." % (name, r.choice(TOWNS),
                                                          r.choice(DAYS)),
                "%s is %d minutes long and came out in %d." % (
                    name, r.randint(85, 170), r.randint(1995, 2024)),
            ])
            extra = r.choice(["The theater was %s." % r.choice(["packed", "half empty",
                                                                 "cold", "very quiet"]),
                              "My %s fell asleep after %d minutes." % (
                                  r.choice(["brother", "friend", "dad"]), r.randint(10, 90))])
        else:
            head = "I bought %s in %s for %s." % (name, r.choice(MONTHS),
                                                  _price(r, 25, 900))
            extra = r.choice(["It arrived after %d days." % r.randint(2, 14),
                              "I have used it every day for %d weeks." % r.randint(2, 30)])
        sents, score = [], 0
        for _ in range(r.randint(2, 4)):
            label = r.randrange(2)
            text, _, _ = g.example(label)
            sents.append(_cap(text.rstrip(".!")) + r.choice([".", ".", ".", "!"]))
            score += 1 if label else -1
        if r.random() < 0.7:
            sents.insert(r.randint(0, len(sents)), extra)
        stars = max(1, min(5, 3 + score))
        tail = r.choice(["Overall, I would give it %d out of 5 stars." % stars,
                         "Rating: %d/5." % stars,
                         "%s star%s." % (_cap(_num_word(stars)), "s" if stars > 1 else "")])
        return " ".join([head] + sents + [tail])

    def letter(self):
        r = self.r
        (A, _), (B, _) = self.people()
        C, pc = r.choice([x for x in NAMES if x[0] not in (A, B)])
        body = [
            "Thank you for your letter of %s %d. It arrived on a %s %s." % (
                r.choice(MONTHS), r.randint(1, 28), r.choice(WEATHER), r.choice(DAYS)),
            "The garden is doing well this year: we have %d tomato plants and far too many %s."
            % (r.randint(3, 20), r.choice(["beans", "courgettes", "weeds", "snails"])),
            "I finally finished the %s I told you about, and it took me %d weeks." % (
                r.choice(["bookshelf", "quilt", "painting", "novel", "model ship"]),
                r.randint(2, 30)),
            "Do you remember the %s in %s? It closed in %d, and nobody knows why." % (
                r.choice(PLACES), r.choice(TOWNS), r.randint(1998, 2023)),
            "%s sends %s love and asks when you will visit again." % (C, _possessive(pc)),
            "The train from %s now takes only %d minutes, so there is no excuse." % (
                r.choice(TOWNS), r.randint(25, 140)),
            "I am sending you %s %s with this letter; please share them." % (
                _num_word(r.randint(2, 6)), r.choice(["postcards", "photographs", "recipes",
                                                       "seed packets"])),
        ]
        first = body[0]
        rest = body[1:]
        r.shuffle(rest)
        lines = ["Dear %s," % B, "", " ".join([first] + rest[:r.randint(1, 3)]), "",
                 r.choice(["Best wishes,", "With love,", "Yours,", "Warmly,"]), A]
        return "\n".join(lines)

    def recipe(self):
        r = self.r
        dish, i1, i2, method, (lo, hi), side = r.choice(RECIPES)
        q1 = "%d cups of %s" % (r.randint(1, 4), i1) if i1 in ("flour", "rice", "oats",
                                                              "lentils", "milk") \
            else "%d %s" % (r.randint(3, 8), i1)
        q2 = "%d %s" % (r.randint(2, 6), i2) if i2 not in ("butter", "milk") \
            else "%d grams of %s" % (r.choice([50, 100, 150, 200]), i2) if i2 == "butter" \
            else "half a liter of milk"
        s = [
            "To make %s for %s people, you will need %s, %s and a pinch of %s." % (
                dish, _num_word(r.randint(2, 8)), q1, q2, r.choice(SPICES)),
            "First, %s." % (
                "heat the oven to %d degrees" % r.choice([160, 180, 200, 220])
                if method.startswith("bake") else
                r.choice(["wash and prepare everything", "get out a large pot",
                          "prepare the %s and the %s" % (i1, i2)])),
            "Then %s for %d minutes%s." % (method, r.randint(lo, hi), r.choice([
                "", ", checking now and then"])),
            "Finally, %s." % r.choice(["add a pinch of %s and taste it" % r.choice(SPICES),
                                       "let it cool for a few minutes",
                                       "serve it with %s" % side]),
            r.choice(["It keeps for %d days in the fridge." % r.randint(2, 5),
                      "My grandmother made it every %s." % r.choice(DAYS),
                      "It is even better the next day.", ""]),
        ]
        return " ".join(x for x in s if x)

    def news(self):
        r = self.r
        town, b = r.choice(TOWNS), r.choice(BUILDINGS)
        title = r.choice(["Mayor", "Councillor", "Dr.", "Mr.", "Ms."])
        last = r.randint(800, 40000)
        s = [
            "%s, %s %d. The town council announced on %s that the old %s on %s will reopen "
            "after %d months of repairs." % (town, r.choice(MONTHS), r.randint(1, 28),
                                             r.choice(DAYS), b, r.choice(STREETS),
                                             r.randint(3, 30)),
            "The work cost about %d,%03d dollars, %d%% more than planned." % (
                r.randint(10, 900), r.randint(0, 999), r.randint(2, 60)),
            "\"%s,\" said %s %s." % (r.choice([
                "We are very pleased with the result", "It took longer than we hoped",
                "The people of %s deserve it" % town, "This is only the first step",
                "I never thought I would see this day"]), title, r.choice(SURNAMES)),
            "Last year, %s people visited the %s, and the council hopes for %s this year." % (
                "{:,}".format(last), b, "{:,}".format(last + r.randint(100, last))),
            "A small celebration is planned for %s at %s, with music and free %s." % (
                r.choice(DAYS), _time(r), r.choice(["lemonade", "coffee", "cake", "ice cream"])),
            "In other news, %d millimeters of rain fell on %s in %s, the most since %d." % (
                r.randint(40, 300), town, r.choice(MONTHS), r.randint(1950, 2015)),
        ]
        first, rest = s[0], s[1:]
        r.shuffle(rest)
        return " ".join([first] + rest[:r.randint(2, 4)])

    def dialogue(self):
        r = self.r
        (A, _), (B, _) = self.people()
        item, place = r.choice(ITEMS), r.choice(PLACES)
        pairs = [
            ("Where are you going?", "To the %s. Do you need anything?" % place),
            ("Could you bring me %s %s?" % (_num_word(r.randint(2, 9)), item),
             "Of course. Anything else?"),
            ("What time is it?", "It is almost %s" % _time(r)),
            ("Did you like the film last night?", r.choice([
                "Not really. The plot was thin, but the music was lovely.",
                "Yes! It was much funnier than I expected.",
                "It was long, but never boring.",
                "I wanted to like it, but the ending was awful."])),
            ("How much were the %s?" % r.choice(ITEMS), "Only %s, can you believe it?" %
             _price(r, 1, 9)),
            ("Is it going to rain?", "The radio said it would be %s all day." %
             r.choice(WEATHER)),
            ("Have you finished the book?", "Almost. I have %d pages left." %
             r.randint(3, 120)),
        ]
        r.shuffle(pairs)
        lines = []
        for q, a in pairs[:r.randint(2, 4)]:
            lines.append("%s: %s" % (A, q))
            lines.append("%s: %s" % (B, a))
        return "\n".join(lines)

    def diary(self):
        r = self.r
        s = ["%s, %s %d." % (r.choice(DAYS), r.choice(MONTHS), r.randint(1, 28)),
             "Woke up at %s" % _time(r, morning=True)]
        pool = [
            "Walked %.1f km along the river before breakfast." % (r.randint(10, 90) / 10),
            "The %s was closed, so I went to the %s instead." % tuple(r.sample(PLACES, 2)),
            "Read %d pages of a book about %s." % (r.randint(5, 80), r.choice(
                ["lighthouses", "bees", "old maps", "the moon", "trains", "volcanoes"])),
            "Lunch was %s; it was %s." % (r.choice(RECIPES)[0], r.choice(
                ["good", "too salty", "better than yesterday", "cold by the time I ate it"])),
            "%s called and we talked for %d minutes." % (r.choice(NAMES)[0], r.randint(2, 90)),
            "Spent %s on %s and %s." % ((_price(r, 2, 30),) + tuple(r.sample(ITEMS, 2))),
            "The weather was %s, then %s." % tuple(r.sample(WEATHER, 2)),
            "Fixed the %s at last." % r.choice(["kitchen tap", "bicycle chain", "gate",
                                                 "radio", "window latch"]),
        ]
        r.shuffle(pool)
        s += pool[:r.randint(2, 5)]
        s.append(r.choice(["Early night.", "Tomorrow will be better.", "A good day, all in all.",
                           "Too tired to write more.", "I must remember to buy %s." %
                           r.choice(ITEMS)]))
        return " ".join(s)

    def paragraph(self):
        kinds = [(self.story, 4), (self.review, 3), (self.letter, 1), (self.recipe, 1),
                 (self.news, 1.5), (self.dialogue, 1.5), (self.diary, 1.5)]
        f = self.r.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        return f()

    def text(self, nbytes):
        out, size = [], 0
        while size < nbytes:
            p = self.paragraph()
            out.append(p)
            size += len(p) + 2
        return "\n\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------

def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data.encode("ascii")  # plain ASCII only
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(root, "data"))
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    say = (lambda *a: None) if args.quiet else print

    self_check()
    train, val = gen_sentiment(SEED_SENTIMENT)
    for name, rows in (("train", train), ("val", val)):
        for lab, text, _ in rows:
            assert lab in (0, 1) and text and "\t" not in text and "\n" not in text
        write(os.path.join(args.out, "sentiment", name + ".tsv"),
              "".join("%d\t%s\n" % (lab, text) for lab, text, _ in rows))
    assert not {norm(t) for _, t, _ in train} & {norm(t) for _, t, _ in val}

    corpus = Prose(SEED_CORPUS).text(CORPUS_BYTES)
    cval = Prose(SEED_CORPUS_VAL).text(CORPUS_VAL_BYTES)
    write(os.path.join(args.out, "tinytext", "corpus.txt"), corpus)
    write(os.path.join(args.out, "tinytext", "val.txt"), cval)

    for name, rows in (("train", train), ("val", val)):
        n = len(rows)
        pos = sum(l for l, _, _ in rows)
        lens = sorted(len(t.encode()) for _, t, _ in rows)
        say("sentiment/%s.tsv: %d lines, label 1: %d (%.1f%%), label 0: %d; text bytes "
            "min %d / median %d / mean %.1f / max %d; > %d bytes: %d" % (
                name, n, pos, 100.0 * pos / n, n - pos, lens[0], lens[n // 2],
                sum(lens) / n, lens[-1], MAX_TEXT_BYTES, sum(x > MAX_TEXT_BYTES for x in lens)))
    fam = Counter(s.split("-")[0] for _, _, s in train)
    say("family mix (train): " + ", ".join("%s %.1f%%" % (k, 100.0 * fam[k] / len(train))
                                           for k in ("plain", "neg", "contrast")))
    maj = max(sum(l for l, _, _ in val), len(val) - sum(l for l, _, _ in val)) / len(val)
    say("baselines on val: majority %.3f | unigram naive Bayes %.3f | unigram logistic %.3f "
        "| (bigram naive Bayes %.3f, for reference)" % (
            maj, naive_bayes(train, val, toks), logistic(train, val, toks),
            naive_bayes(train, val, bigrams)))
    say("tinytext/corpus.txt: %d bytes, %d lines; tinytext/val.txt: %d bytes, %d lines" % (
        len(corpus), corpus.count("\n"), len(cval), cval.count("\n")))


if __name__ == "__main__":
    sys.exit(main())
