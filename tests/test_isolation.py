"""The suite runs with every user directory pointed into its temporary directory."""

from pathlib import Path

import platformdirs

from specllama.models.sources import cache_dir


def test_the_suite_never_writes_into_the_users_directories(tmp_path_factory):
    root = tmp_path_factory.getbasetemp().resolve()
    for path in (
        cache_dir(),
        platformdirs.user_cache_path("specllama"),
        platformdirs.user_config_path("specllama"),
        platformdirs.user_state_path("specllama"),
    ):
        assert Path(path).resolve().is_relative_to(root), path
