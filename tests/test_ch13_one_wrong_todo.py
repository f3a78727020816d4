"""One bug costs one TODO in chapter 13: no TODO's answer calls another's, and each check
builds what it needs with the course's functions or its own (the decoder's check packs its
records with the course's packer), so a wrong TODO reaches no other TODO's check."""

from __future__ import annotations

import types

from mutants.ch13 import MUTANTS
from one_wrong_todo import FunctionTodos

from autograder.answers import definition
from autograder.checks import ch13 as visible
from autograder.hidden import ch13 as hidden
from course.v1 import kv_quant, mla_engine
from kernels import latent_record

PYTHON_TODOS = {"kv_scale": kv_quant, "quantize_fp8": kv_quant,
                "absorbed_decode": mla_engine, "pack_latent_fp8": latent_record}

_reference = types.ModuleType("chapter_13_functions")
for _name, _module in PYTHON_TODOS.items():
    setattr(_reference, _name, getattr(_module, _name))
TODOS = FunctionTodos(_reference, {name: MUTANTS[name] for name in PYTHON_TODOS}, visible,
                      hidden, "13")


def test_no_todo_builds_on_another():
    assert set(MUTANTS) == set(PYTHON_TODOS) | {"e4m3_to_float"}
    assert TODOS.building_on_others() == {}
    kernel_source = definition("kernels.mla_decode", "e4m3_to_float")
    assert not [name for name in PYTHON_TODOS if name in kernel_source]
