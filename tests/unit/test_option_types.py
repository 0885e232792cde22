"""``airflow_pg_bulk/option_types.py`` is generated from the options' declaration: it must be
current (run ``python -m airflow_pg_bulk.options`` after changing ``OPTIONS``)."""

import typing

from airflow_pg_bulk import option_types, options


def test_the_generated_typed_dict_is_current():
    assert options.TYPED_DICT_PATH.read_text() == options.typed_dict_source()


def test_it_names_every_option():
    assert tuple(typing.get_type_hints(option_types.LoadOptions)) == options.NAMES
