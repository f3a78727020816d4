"""The hidden side of the checks: thorough checks, and the oracles, models and known mistakes
that would answer a TODO. Instructor-only: the learner edition leaves this package out, and
its visible checks replay what they asked of it (``autograder.private``)."""
