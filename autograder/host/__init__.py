"""The grader's own process: it finds a class's submissions, grades each through nbgrader in a
sandbox, and records and reports the grades. It reads a submission and never runs it
(``autograder/__init__.py`` draws the map)."""
