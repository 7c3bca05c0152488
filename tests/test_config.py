import pytest
import yaml

from dlmrl.cli import default_config_path, main
from dlmrl.config import Config, ConfigError, apply_overrides, help_text, iter_fields, load_yaml, validate


def test_default_recipe_loads_and_validates():
    cfg = Config()
    load_yaml(cfg, default_config_path())
    validate(cfg)
    assert cfg.model.name_or_path == "tiny-sudoku"
    from dlmrl.config import estimator_name

    # the default job scores with the trajectory likelihood, two sampling steps per canvas (README's benchmark)
    assert estimator_name(cfg) == "trajectory" and (cfg.estimator.order, cfg.estimator.merge) == ("sampled", 2)
    assert estimator_name(Config()) == "sdmc"  # a config naming no estimator: gdpo's own


def test_recipe_in_configs_is_the_packaged_one():
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "configs" / "gdpo_sudoku_tiny.yaml"
    assert src.read_text() == default_config_path().read_text()


def test_overrides_dotted_and_bare():
    cfg = Config()
    apply_overrides(cfg, ["train.learning_rate=3e-5", "num_generations=4", "epsilon_high=0.28", "task.train_file=null"])
    assert cfg.train.learning_rate == 3e-5 and cfg.train.num_generations == 4
    assert cfg.train.epsilon_high == 0.28 and cfg.task.train_file is None


def test_string_override_keeps_text():
    cfg = Config()
    apply_overrides(cfg, ["model.name_or_path=123"])
    assert cfg.model.name_or_path == "123"


@pytest.mark.parametrize(
    "override, match",
    [
        ("nope=1", "unknown config key 'nope'"),
        ("learning_rat=1", "Did you mean"),
        ("trian=1", "Did you mean train,"),  # a misspelt section suggests the section
        ("steps=3", "ambiguous"),
        ("train.max_steps=abc", "train.max_steps"),
        ("train.max_steps=1.5", "expects int"),
        ("noequals", "key=value"),
    ],
)
def test_bad_overrides_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        apply_overrides(Config(), [override])


@pytest.mark.parametrize(
    "override, key",
    [
        ("epsilon=1.5", "train.epsilon"),
        ("num_generations=1", "train.num_generations"),
        ("sampling.block_length=5", "sampling.block_length"),
        ("sampling.steps=0", "sampling.steps"),
        ("estimator.name=foo", "estimator.name"),
        ("estimator.name=exact", "estimator.name"),
        ("estimator.masking=foo", "estimator.masking"),
        ("task.answer_mode=foo", "task.answer_mode"),
        ("scale_rewards=foo", "train.scale_rewards"),
        ("lr_scheduler_type=cosin", "train.lr_scheduler_type"),
    ],
)
def test_validation_names_the_key(override, key):
    cfg = Config()
    apply_overrides(cfg, [override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(cfg)


def test_yaml_error_names_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("train:\n  learning_rate: 1e-4\n  max_stepz: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml line 3"):
        load_yaml(Config(), p)


def test_help_lists_every_field():
    text = help_text(Config)
    for key, field, _ in iter_fields(Config):
        assert key in text
        assert field.metadata.get("help"), f"{key} has no help"


def test_cli_rejects_bad_key_before_compute(capsys):
    assert main(["train", "foo=1"]) == 2
    assert "unknown config key 'foo'" in capsys.readouterr().err


def test_cli_help_lists_fields(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "train.num_iterations" in out and "estimator.num_nodes" in out


def test_the_top_level_help_names_every_registry_dlmrl_list_takes(capsys):
    """families and envs were missing from `dlmrl --help` though `dlmrl list` takes them."""
    from dlmrl.listing import _REGISTRIES

    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # (argparse wraps the help)
    assert f"List a registry ({', '.join(_REGISTRIES)})." in out
    assert {"families", "envs"} <= set(_REGISTRIES)


def test_dataclass_defaults_are_the_default_recipe():
    """--help shows the defaults the default job uses; a --config file starts from them too."""
    from dlmrl.config import to_dict

    recipe = Config()
    load_yaml(recipe, default_config_path())
    # except the estimator: the recipe names trajectory (merge 2); the dataclass leaves it to the algorithm
    # (estimator.name null = the preset's own), so a config that picks another algorithm gets that one's
    assert (recipe.estimator.name, recipe.estimator.merge) == ("trajectory", 2)
    assert (Config().estimator.name, Config().estimator.merge) == (None, 1)
    recipe.estimator.name, recipe.estimator.merge = None, 1
    assert to_dict(recipe) == to_dict(Config())


def test_yaml_bare_leaf_and_empty_section(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("learning_rate: 3.0e-5\ntrain:\neval:\n  steps: 4\n")
    cfg = Config()
    load_yaml(cfg, p)
    assert cfg.train.learning_rate == 3e-5 and cfg.eval.steps == 4


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  max_steps: 4\n  epsilon: 0.2\n  max_steps: 9\n")
    with pytest.raises(ConfigError, match=r"c\.yaml line 4, column 3: .*'max_steps' is given twice \(first on line 2\)"):
        load_yaml(Config(), p)


def test_every_bad_value_of_a_file_is_reported_at_once_one_per_line(tmp_path, capsys):
    """Three mistakes, one error with three lines naming each key and its line (only the first was reported, so
    each fix took another run); the good values are not in it, and an override of a bad key does not take the
    file's blame."""
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  max_steps: abc\n  learning_rate: 1.0e-4\n  epsilonn: 0.2\neval:\n  steps: x\n")
    with pytest.raises(ConfigError) as err:
        load_yaml(Config(), p)
    assert str(err.value).splitlines() == [
        f"{p}: 3 bad values, one per line:",
        f"  {p} line 2: config key 'train.max_steps' expects int, got 'abc'",
        (f"  {p} line 4: unknown config key 'train.epsilonn'. Did you mean train.epsilon, train.epsilon_high, "
         "train.env? (see --help for every key)"),
        f"  {p} line 6: config key 'eval.steps' expects int, got 'x'"]
    assert main(["train", "--dry-run", "--config", str(p), "train.max_steps=3"]) == 2
    assert capsys.readouterr().err.startswith(f"dlmrl train: config error: {p}: 3 bad values, one per line:\n")


def test_yaml_line_is_section_aware(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("sampling:\n  steps: 4\neval:\n  steps: abc\n")
    with pytest.raises(ConfigError, match=r"c\.yaml line 4"):
        load_yaml(Config(), p)


def test_validation_error_from_yaml_names_file_and_line(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  epsilon: 2.0\n")
    assert main(["train", "--config", str(p)]) == 2
    assert "c.yaml line 2" in capsys.readouterr().err


def test_an_error_in_a_key_the_file_does_not_set_says_it_is_the_default(tmp_path, capsys):
    """A held-out file of 10 puzzles with the default eval.num_puzzles (256): the YAML file, which does not set it,
    is not blamed (it was prefixed "c.yaml: " as if it did); a key set as a dotted top-level key is found."""
    from dlmrl.data.sudoku import load_test_split

    test = tmp_path / "test.csv"
    test.write_text("Puzzle,Solution\n" + "".join(f"{e.puzzle},{e.solution}\n" for e in load_test_split()[:10]))
    p = tmp_path / "c.yaml"
    p.write_text(f"task:\n  test_file: {test}\n")
    assert main(["train", "--config", str(p), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"config error: config key 'eval.num_puzzles': 256 puzzles asked, the held-out split has 10 (the default " \
           f"value: {p} does not set eval.num_puzzles)" in err, err
    p.write_text(f"task:\n  test_file: {test}\neval.num_puzzles: 300\n")
    assert main(["train", "--config", str(p), "--dry-run"]) == 2
    assert f"config error: {p} line 3: config key 'eval.num_puzzles': 300 puzzles" in capsys.readouterr().err


def test_a_bad_override_is_blamed_on_the_override_not_on_the_file(tmp_path, capsys):
    """The file sets a valid value on line 2; the bad one came from the command line (found by a new user)."""
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  epsilon: 0.2\n  num_generations: 4\n")
    assert main(["train", "--config", str(p), "--dry-run", "train.epsilon=2.0"]) == 2
    err = capsys.readouterr().err
    assert "command-line override 'train.epsilon=2.0'" in err and "line 2" not in err
    assert main(["train", "--config", str(p), "--dry-run", "num_generations=1"]) == 2  # a bare leaf name
    err = capsys.readouterr().err
    assert "command-line override 'num_generations=1'" in err and "line 3" not in err


def test_overrides_after_flags_and_non_finite_numbers(capsys):
    assert main(["train", "--no-progress", "foo=1"]) == 2
    assert "unknown config key 'foo'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="finite"):
        apply_overrides(Config(), ["learning_rate=inf"])


def test_bad_data_file_fails_before_compute(tmp_path):
    bad = tmp_path / "test.csv"
    bad.write_text("Puzzle,Solution\n123,1234\n")
    cfg = Config()
    apply_overrides(cfg, [f"task.test_file={bad}"])
    with pytest.raises(ConfigError, match="line 2"):
        validate(cfg)


def test_eval_larger_than_split_is_rejected(tmp_path):
    cfg = Config()
    apply_overrides(cfg, ["eval.num_puzzles=1000"])
    with pytest.raises(ConfigError, match="eval.num_puzzles"):
        validate(cfg)


@pytest.mark.parametrize(("text", "line", "hint"), [
    ("train:\n  algorithm: gdpo\n learning_rate: 1e-4\n", 3, "indentation"),
    ("train:\n  algorithm: gdpo\n    learning_rate: 1e-4\n", 3, "indentation"),
    ("train:\n\talgorithm: gdpo\n", 2, "tabs"),
])
def test_a_yaml_syntax_error_names_the_file_line_and_the_likely_cause(tmp_path, text, line, hint):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=rf"bad\.yaml line {line}, column \d+: invalid YAML: .*{hint}") as err:
        load_yaml(Config(), p)
    assert "<unicode string>" not in str(err.value) and "\n" not in str(err.value)


def test_estimator_fields_that_do_not_apply_and_infinite_variance_warn():
    cfg = Config()
    apply_overrides(cfg, ["estimator.name=sdmc", "estimator.merge=3", "estimator.t_min=0.1"])
    with pytest.warns(UserWarning, match=r"estimator\.t_min, estimator\.merge do not apply to the 'sdmc'"):
        validate(cfg)
    cfg = Config()
    apply_overrides(cfg, ["estimator.name=double_mc", "estimator.masking=bernoulli"])
    with pytest.warns(UserWarning, match="infinite variance"):
        validate(cfg)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default recipe, and a preset's own recipe estimator: no warning
        validate(Config())
        recipe = Config()
        load_yaml(recipe, default_config_path())
        validate(recipe)
        # the default recipe's own merge: 2 is not the user's doing when they switch its estimator
        apply_overrides(recipe, ["estimator.name=sdmc"])
        validate(recipe)
        for algorithm in ("spg", "just_grpo", "espo_dllm"):
            cfg = Config()
            apply_overrides(cfg, [f"algorithm={algorithm}"])
            validate(cfg)


def test_changing_the_default_recipes_algorithm_gives_that_algorithms_estimator(capsys):
    """The default recipe's estimator (trajectory, merge 2) is its GDPO's: ``dlmrl train algorithm=diffu_grpo`` is
    diffu_grpo with its own one_step (as a config naming no estimator gets), said on stderr; an estimator key on
    the command line (dotted or bare) keeps the user's choice."""
    import yaml

    from dlmrl.config import default_job_config

    def plan(*overrides):
        assert main(["train", "--dry-run", *overrides]) == 0
        out = capsys.readouterr()
        return yaml.safe_load(out.out.split("\n", 1)[1])["estimator"], out.err

    est, err = plan()
    assert (est["name"], est["merge"], err) == ("trajectory", 2, "")
    est, err = plan("algorithm=diffu_grpo")
    assert est["name"] == "one_step" and "using diffu_grpo's own (one_step" in err
    est, err = plan("algorithm=tracerl")  # tracerl's own: trajectory, unmerged (4 sampling steps: NFE 4)
    assert (est["name"], est["nfe"]) == ("trajectory", 4) and "tracerl's own" in err
    for chosen in (["estimator.name=trajectory"], ["merge=2"]):
        est, err = plan("algorithm=diffu_grpo", *chosen)
        assert (est["name"], est["merge"], err) == ("trajectory", 2, ""), chosen
    # the Python path builds the same configs
    assert default_job_config(["algorithm=diffu_grpo"]).estimator == Config().estimator
    assert default_job_config().estimator.name == "trajectory"
    capsys.readouterr()


def test_unreadable_config_files_are_config_errors(tmp_path, capsys):
    """A missing file, a folder and a file that is not UTF-8 stop with a message, not a traceback."""
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"train:\n  max_steps: 3\n\xff\xfe\n")
    for path, match in ((tmp_path / "nope.yaml", "does not exist"), (tmp_path, "is not a file"),
                        (bad, "bad.yaml line 3: not UTF-8 text")):
        assert main(["train", "--dry-run", "--config", str(path)]) == 2
        assert match in capsys.readouterr().err, path


def test_a_utf16_config_file_is_named_utf16(tmp_path, capsys):
    path = tmp_path / "u16.yaml"
    path.write_text("train:\n  max_steps: 3\n", encoding="utf-16")
    assert main(["train", "--dry-run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: UTF-16 text (its first two bytes are the UTF-16 little-endian byte-order mark 0xFF 0xFE); " \
           "config files are read as UTF-8: save it as UTF-8" in err, err


@pytest.mark.parametrize("overrides, key", [
    (["algorithm=spg", "estimator.name=spg", "estimator.mask_block_length=5"], "estimator.mask_block_length"),
    (["algorithm=spg", "estimator.name=spg", "estimator.mask_block_length=32"], "estimator.mask_block_length"),
    (["estimator.merge=100000000000000000000000"], "estimator.merge"),
])
def test_values_that_would_fail_after_the_model_loads_are_refused_up_front(overrides, key):
    from dlmrl.config import default_job_config

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        default_job_config(overrides)


def test_a_preset_estimator_by_null_gets_the_presets_settings_not_the_recipes():
    """estimator.name=null on the default recipe: tracerl and just_grpo score unmerged (their papers'), not with
    the recipe's merge 2."""
    from dlmrl.config import default_job_config, estimator_settings

    for algorithm, order in (("tracerl", "sampled"), ("just_grpo", "left_to_right")):
        name, e = estimator_settings(default_job_config([f"algorithm={algorithm}", "estimator.name=null"]))
        assert (name, e.order, e.merge) == ("trajectory", order, 1), algorithm


def test_list_keys_take_comma_lists_yaml_lists_and_top_level_names(tmp_path):
    cfg = Config()
    apply_overrides(cfg, ["reward_funcs=my_pkg.rewards:exact_match, xmlcount", "train.reward_weights=[1, 0.5]"])
    assert cfg.train.reward_funcs == ["my_pkg.rewards:exact_match", "xmlcount"]
    assert cfg.train.reward_weights == [1.0, 0.5] and all(isinstance(w, float) for w in cfg.train.reward_weights)
    apply_overrides(cfg, ["reward_funcs=", "reward_weights=2"])
    assert cfg.train.reward_funcs == [] and cfg.train.reward_weights == [2.0]
    p = tmp_path / "r.yaml"
    p.write_text("reward_funcs: [a:b, gsm8k]\ntrain:\n  reward_weights: [1, x]\n")
    with pytest.raises(ConfigError, match=r"r\.yaml line 3: config key 'train\.reward_weights\[1\]' expects float"):
        load_yaml(Config(), p)
    p.write_text("reward_funcs: [a:b, gsm8k]\n")
    cfg = Config()
    load_yaml(cfg, p)
    assert cfg.train.reward_funcs == ["a:b", "gsm8k"]


AR_JOB = ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full", "algorithm=grpo"]


@pytest.mark.parametrize("key", ["estimator.num_nodes=3", "estimator.t_min=0.2", "estimator.merge=2",
                                 "estimator.options={}"])
def test_the_ar_kind_refuses_estimator_keys_the_user_set_to_their_defaults_too(key, tmp_path, capsys):
    """Equal to the default (or the recipe's value) the key is still ignored by an AR run: refused as any other,
    from an override, the user's YAML file or the Python API's dict; a run's saved config (a full dump, which
    holds the estimator section) resumes."""
    from dlmrl.api import trainer_config
    from dlmrl.config import default_job_config

    name, value = key.split("=")
    with pytest.raises(ConfigError, match=rf"config key '{name}': model.kind 'ar' scores exact token log-probs"):
        validate(default_job_config([*AR_JOB, key]))
    section, leaf = name.split(".")
    p = tmp_path / "ar.yaml"
    p.write_text("model:\n  kind: ar\n  name_or_path: tiny-sudoku-ar\ntask:\n  answer_mode: full\ntrain:\n"
                 f"  algorithm: grpo\n{section}:\n  {leaf}: {value}\n")
    assert main(["train", "--dry-run", "--config", str(p)]) == 2
    assert f"{p} line 9: config key '{name}': model.kind 'ar'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=rf"config key '{name}': model.kind 'ar'"):
        validate(trainer_config({"model.kind": "ar", name: yaml.safe_load(value)}, "tiny-sudoku-ar"), data=False)


def test_an_ar_run_resumes_from_its_saved_config(tmp_path, capsys):
    from dlmrl.config import default_job_config, save_yaml

    out = tmp_path / "run"
    out.mkdir()
    save_yaml(default_job_config([*AR_JOB, f"output_dir={out}"]), out / "config.yaml")  # (estimator keys in full)
    assert main(["train", "--resume", "--dry-run", "--output-dir", str(out)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("key", ["estimator.merge=4", "estimator.name=sdmc", "estimator.order=left_to_right",
                                 "estimator.options={merge: 2}"])
def test_the_ar_kind_refuses_estimator_keys_it_would_ignore(key):
    """An AR policy scores exact token log-probs: an estimator setting would be silently unused."""
    from dlmrl.config import default_job_config

    name = key.split("=")[0]
    with pytest.raises(ConfigError, match=rf"config key '{name}': model.kind 'ar' scores exact token log-probs"):
        validate(default_job_config([*AR_JOB, key]))
    validate(default_job_config(AR_JOB))  # (the default recipe's own estimator section is not the user's)
    validate(default_job_config([key]))  # (the same key on the default diffusion job is used, not refused)
