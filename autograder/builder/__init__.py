"""The instructor's build: the notebooks rendered from the library and released, the learner
edition, the translations, a class's course directory, the benchmarks
(``autograder/__init__.py`` draws the map)."""
