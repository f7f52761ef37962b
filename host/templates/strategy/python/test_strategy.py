"""The logic of `{{name}}`, natively: `.venv/bin/python -m unittest`."""

import unittest

from switchyard_strategy import Candidate, Request, parse_params

from {{name}} import Router


def router(params="{}"):
    return Router.create("m", parse_params(Router.Params, params))


class RouterTest(unittest.TestCase):
    def test_every_candidate_once_and_the_same_seed_the_same_order(self):
        candidates = [Candidate(index=2, weight=1.0), Candidate(index=0, weight=3.0), Candidate(index=1, weight=0.0)]
        for seed in range(200):
            order = router().select(Request(seed=seed), candidates).order
            self.assertEqual(sorted(order), [0, 1, 2])
            self.assertNotEqual(order[0], 1, "weight 0 is never the primary")
            self.assertEqual(order, router().select(Request(seed=seed), candidates).order)

    def test_the_pinned_upstream_leads_unless_told_otherwise(self):
        candidates = [Candidate(index=0), Candidate(index=1, affinity_pinned=True)]
        for seed in range(50):
            self.assertEqual(router().select(Request(seed=seed), candidates).order[0], 1)
        free = router('{"honour_affinity": false}')
        primaries = {free.select(Request(seed=seed), candidates).order[0] for seed in range(50)}
        self.assertEqual(primaries, {0, 1}, "both are drawn when affinity is ignored")


if __name__ == "__main__":
    unittest.main()
