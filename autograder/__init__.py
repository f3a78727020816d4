"""The course's autograder: checks for the notebooks' test cells, and a CLI around nbgrader.

``autograder.checks`` is imported by learners' notebooks and needs only the course library;
the grading modules need nbgrader (the ``grader`` extra).
"""
