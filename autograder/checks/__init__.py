"""The checks that the notebooks' test cells call, one module per chapter.

A check takes the learner's function, calls it on cases, and raises ``AssertionError`` with a
hint in the learner's terms when a result is wrong: the call, what was expected, what came
back, and the idea behind it. Checks assert the contract the notebook states, never an
incidental choice, so every correct implementation passes.
"""
