"""The package's public names stay what they say, whatever was imported first."""

import lightspeed


def test_default_model_is_the_function_even_after_its_module_is_imported():
    import lightspeed.loader  # noqa: F401  (imports the module that defines default_model)
    import lightspeed.model_files  # noqa: F401

    assert callable(lightspeed.default_model)
    assert lightspeed.default_model() == lightspeed.model_files.default_model()


def test_every_export_resolves():
    for name in lightspeed.__all__:
        assert getattr(lightspeed, name) is not None
