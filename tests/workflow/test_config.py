"""config.yaml against its schema and cross-checks; the paper's run grid; the dry run."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from tests.helpers.configs import merged
from tests.helpers.repo import REPO
from tests.helpers.workflow import paper_dry_run
from vitplasticity.workflow.config import (
    DATASET_KEYS,
    MODEL_ID_KEYS,
    ConfigError,
    check_keys,
    enabled_experiments,
    experiment_runs,
    load_schema,
    unknown_keys,
)
from vitplasticity.workflow.config_check import check_config

SCHEMA = str(REPO / "workflow/schemas/config.schema.yaml")


@pytest.fixture
def paper_config() -> dict:
    return yaml.safe_load((REPO / "config/config.yaml").read_text())


def test_paper_config_is_valid(paper_config: dict) -> None:
    validate(copy.deepcopy(paper_config), SCHEMA)
    check_config(paper_config)


def test_demo_preset_is_valid(paper_config: dict) -> None:
    demo = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    config = merged(paper_config, demo)
    validate(config, SCHEMA)
    check_config(config)
    assert config["demo"] is True


def test_paper_grid_matches_protocol(paper_config: dict) -> None:
    """docs/protocol.md: 11 x 4 x 3 x 7 SGD runs (+ linear probing), Adam on 4 datasets, ViT-L/H."""
    sgd = experiment_runs(paper_config, "sgd")
    single = [run for run in sgd if run.configuration != "head"]
    assert len(single) == 924
    assert len(sgd) == 924 + 11 * 4 * 3
    assert len(experiment_runs(paper_config, "adam")) == 4 * 4 * 3 * 7
    assert len(experiment_runs(paper_config, "model_size")) == 2 * 4 * 3 * 7
    clipart = {run.lr for run in sgd if run.dataset == "domainnet-clipart"}
    assert clipart == {3e-3, 1e-2, 3e-2, 6e-2}
    adam_cifar = {
        run.lr for run in experiment_runs(paper_config, "adam") if run.dataset == "cifar100"
    }
    assert adam_cifar == {1e-5, 3e-5, 1e-4, 3e-4}  # the SGD grid / 100
    assert {run.seed for run in sgd} == {0, 42, 3407}


@pytest.mark.parametrize(
    ("override", "culprit"),
    [
        ({"experiments": {"sgd": {"lrs": [-0.1]}}}, "['experiments']['sgd']['lrs'][0]"),
        ({"experiments": {"sgd": {"lrs": "0.1"}}}, "['experiments']['sgd']['lrs']"),
        ({"experiments": {"sgd": {"seeds": []}}}, "['experiments']['sgd']['seeds']"),
        (
            {"experiments": {"sgd": {"configurations": ["mlp"]}}},
            "['experiments']['sgd']['configurations'][0]",
        ),
        ({"plasticity": {"protocols": ["in-situ"]}}, "['plasticity']['protocols'][0]"),
        ({"finetune": {"batch_size": "512"}}, "['finetune']['batch_size']"),
        ({"report": {"alpha": 1.5}}, "['report']['alpha']"),
        ({"finetune": {"batchsize": 4}}, "batchsize"),
    ],
)
def test_schema_names_the_bad_key(paper_config: dict, override: dict, culprit: str) -> None:
    with pytest.raises(WorkflowError) as error:
        validate(merged(paper_config, override), SCHEMA)
    assert culprit in str(error.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"experiments": {"sgd": {"datasets": ["cifar11"]}}},
            "experiments.sgd.datasets: unknown dataset 'cifar11'",
        ),
        (
            {"experiments": {"adam": {"models": ["vit_giant"]}}},
            "experiments.adam.models: unknown model 'vit_giant'",
        ),
        (
            {"plasticity": {"datasets": ["imagenet"]}},
            "plasticity.datasets: unknown dataset 'imagenet'",
        ),
        ({"plasticity": {"models": ["resnet"]}}, "plasticity.models: unknown model 'resnet'"),
        (
            {"experiments": {"sgd": {"lrs_by_dataset": {"svhn": [0.1]}}}},
            "experiments.sgd.lrs_by_dataset: unknown dataset 'svhn'",
        ),
        (
            {"reference": {"source": "dataset", "dataset": "nope"}},
            "reference.dataset: unknown dataset 'nope'",
        ),
        ({"experiments": {"sgd": {"lrs": []}}}, "experiments.sgd.lrs: empty grid"),
    ],
)
def test_cross_checks_name_the_key(paper_config: dict, override: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(merged(paper_config, override))


def test_disabled_experiment_is_not_checked(paper_config: dict) -> None:
    config = merged(
        paper_config, {"experiments": {"model_size": {"enabled": False, "models": ["x"]}}}
    )
    check_config(config)


def job_counts(output: str) -> dict[str, int]:
    table = output[output.index("Job stats:") :].split("\n\n")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.mark.slow
def test_dry_run_lists_the_whole_paper_without_imagenet(tmp_path: Path) -> None:
    """`snakemake -n all` on config.yaml: every job, no network, ImageNet path still unset."""
    result = paper_dry_run(tmp_path, "all", env={"VITPLASTICITY_IMAGENET": ""})
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout + result.stderr)
    assert counts["finetune"] >= 1356
    assert counts["plasticity"] == 3 * 11
    assert counts["prepare"] == 11
    assert counts["reference"] == 1


def test_unknown_name_stops_the_workflow_before_any_job(tmp_path: Path) -> None:
    result = paper_dry_run(
        tmp_path, "all", edit=yaml.safe_dump({"experiments": {"sgd": {"datasets": ["cifar11"]}}})
    )
    assert result.returncode != 0
    assert "experiments.sgd.datasets: unknown dataset 'cifar11'" in result.stderr + result.stdout


# --- strict keys ------------------------------------------------------------------------------

SCHEMA_DICT = load_schema(SCHEMA)
SHA256 = "sha256:" + "ab" * 32


def shipped_configs() -> dict[str, dict]:
    """config.yaml alone, with each workflow preset, and with the demo and each test preset
    (merged as the Makefile and the tests pass them to --configfile)."""
    paper = yaml.safe_load((REPO / "config/config.yaml").read_text())
    demo = merged(paper, yaml.safe_load((REPO / "config/demo.yaml").read_text()))
    configs = {"config.yaml": paper}
    for preset in sorted(set((REPO / "config").glob("*.yaml")) - {REPO / "config/config.yaml"}):
        configs[preset.name] = merged(paper, yaml.safe_load(preset.read_text()))
    for preset in sorted((REPO / "tests/presets").glob("*.yaml")):
        configs[f"demo+{preset.name}"] = merged(demo, yaml.safe_load(preset.read_text()))
    return configs


def test_every_shipped_config_has_only_known_keys() -> None:
    configs = shipped_configs()
    assert len(configs) >= 3
    for name, config in configs.items():
        assert unknown_keys(config, SCHEMA_DICT) == [], name
        check_keys(config, SCHEMA)  # the path form, as the Snakefile calls it


SYNTHETIC = {"source": "synthetic", "steps": 1, "val_every": 1}
DINOV2 = {"family": "transformers", "hf_id": "facebook/dinov2-small", "revision": "main"}


@pytest.mark.parametrize(
    ("override", "path", "suggestion"),
    [
        ({"demos": True}, "demos", "demo"),
        ({"path": {"results": "r"}}, "path", "paths"),
        ({"paths": {"result": "r"}}, "paths.result", "results"),
        ({"models": {"vit_base": {"timm-id": "x"}}}, "models.vit_base.timm-id", "timm_id"),
        (
            {"models": {"vit_base": {"normalize": {"mean": [0] * 3, "std": [1] * 3, "stds": 1}}}},
            "models.vit_base.normalize.stds",
            "std",
        ),
        ({"datasets": {"cifar10": {"archvie": "/x"}}}, "datasets.cifar10.archvie", "archive"),
        ({"datasets": {"cifar10": {"md5": "c58f"}}}, "datasets.cifar10.md5", "checksums"),
        ({"datasets": {"cifar100": {"step": 5}}}, "datasets.cifar100.step", "steps"),
        ({"datasets": {"c10c-snow": {"severty": 3}}}, "datasets.c10c-snow.severty", "severity"),
        (
            {"datasets": {"domainnet-sketch": {"domian": "sketch"}}},
            "datasets.domainnet-sketch.domian",
            "domain",
        ),
        (
            {"datasets": {"flowers102": {"val_evry": 5}}},
            "datasets.flowers102.val_evry",
            "val_every",
        ),
        ({"datasets": {"pet": {"checksum": {}}}}, "datasets.pet.checksum", "checksums"),
        ({"datasets": {"toy": {**SYNTHETIC, "n_pols": 8}}}, "datasets.toy.n_pols", "n_pool"),
        (
            {
                "datasets": {
                    "mine": {"source": "image_folder", "steps": 1, "val_every": 1, "roots": "x"}
                }
            },
            "datasets.mine.roots",
            "root",
        ),
        ({"reference": {"n_image": 5}}, "reference.n_image", "n_images"),
        ({"plasticity": {"n_pair": 5}}, "plasticity.n_pair", "n_pairs"),
        (
            {"text_plasticity": {"n_pair": 5}},
            "text_plasticity.n_pair",
            "n_pairs",
        ),
        (
            {"models": {"dino": {**DINOV2, "hfid": "facebook/dinov2-small"}}},
            "models.dino.hfid",
            "hf_id",
        ),
        (
            {"models": {"dino": {**DINOV2, "model_clas": "X"}}},
            "models.dino.model_clas",
            "model_class",
        ),
        ({"finetune": {"warmup_step": 5}}, "finetune.warmup_step", "warmup_steps"),
        ({"finetune": {"lora": {"rnak": 4}}}, "finetune.lora.rnak", "rank"),
        ({"experiments": {"sgd": {"seed": [0]}}}, "experiments.sgd.seed", "seeds"),
        ({"experiments": {"adam": {"lr": [0.1]}}}, "experiments.adam.lr", "lrs"),
        ({"report": {"lr_select": "val"}}, "report.lr_select", "lr_selection"),
        ({"report": {"figures": {"format": ["pdf"]}}}, "report.figures.format", "formats"),
    ],
)
def test_unknown_key_is_named_with_the_nearest_valid_one(
    paper_config: dict, override: dict, path: str, suggestion: str
) -> None:
    message = f"{path}: unknown key; did you mean {suggestion!r}?"
    assert unknown_keys(merged(paper_config, override), SCHEMA_DICT) == [message]
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_keys(merged(paper_config, override), SCHEMA_DICT)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"datasets": {"cifar10": {"corruption": "snow"}}},
            "datasets.cifar10.corruption: not a key of source 'cifar10' (a key of cifar10c; "
            "cifar10 accepts: archive, checksums, source, steps, url, val_every)",
        ),
        (
            {"datasets": {"pet": {"split": "official"}}},
            "datasets.pet.split: not a key of source 'pet' (a key of domainnet; "
            "pet accepts: archive, checksums, source, steps, url, val_every)",
        ),
        (
            {"datasets": {"toy": {**SYNTHETIC, "url": "https://m.example/x"}}},
            "datasets.toy.url: not a key of source 'synthetic' (a key of cifar10, cifar100, "
            "cifar10c, domainnet, flowers102, pet; synthetic accepts: image_size, n_pool, "
            "n_test, num_classes, seed, source, steps, style, val_every)",
        ),
    ],
)
def test_key_of_another_source_is_rejected(
    paper_config: dict, override: dict, message: str
) -> None:
    assert unknown_keys(merged(paper_config, override), SCHEMA_DICT) == [message]


def test_every_unknown_key_is_listed_at_once(paper_config: dict) -> None:
    config = merged(
        paper_config,
        {
            "plasticity": {"n_pair": 5, "zzz": 1},
            "datasets": {"cifar10": {"archvie": "/x"}},
            "finetune": {"lora": {"rnak": 4}},
        },
    )
    with pytest.raises(ConfigError) as error:
        check_keys(config, SCHEMA_DICT)
    message = str(error.value)
    assert "4 unknown or outdated key(s)" in message
    assert "datasets.cifar10.archvie: unknown key; did you mean 'archive'?" in message
    assert "plasticity.n_pair: unknown key; did you mean 'n_pairs'?" in message
    assert "finetune.lora.rnak: unknown key; did you mean 'rank'?" in message
    # No near key: every valid one is listed instead.
    assert (
        "plasticity.zzz: unknown key (valid here: batch_size, datasets, device, "
        "downstream_split, dtype, fc1, models, n_pairs, protocols, stream)" in message
    )


def test_user_names_and_free_form_mappings_are_not_keys(paper_config: dict) -> None:
    config = merged(
        paper_config,
        {
            "models": {
                "my_vit": {
                    "family": "timm",
                    "timm_id": "vit_tiny_patch16_224",
                    "kwargs": {"depth": 2},
                },
                "tiny": {
                    "family": "transformers",
                    "hf_id": "tiny",
                    "weights": "random",
                    "config": {"model_type": "gpt2", "n_layer": 1},
                },
            },
            "experiments": {"sgd": {"lrs_by_dataset": {"pet": [0.1]}}},
        },
    )
    assert unknown_keys(config, SCHEMA_DICT) == []


def test_dataset_keys_table_matches_the_schema() -> None:
    entry = SCHEMA_DICT["properties"]["datasets"]["additionalProperties"]
    assert set(DATASET_KEYS) == set(entry["properties"]["source"]["enum"])
    assert set().union(*DATASET_KEYS.values()) == set(entry["properties"])
    assert entry["additionalProperties"] is False


def test_typo_stops_snakemake_before_planning(tmp_path: Path) -> None:
    result = paper_dry_run(
        tmp_path,
        "all",
        edit="datasets:\n  cifar10: {archvie: /data/cifar-10-python.tar.gz}\nplasticity: {n_pair: 64}\n",
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "datasets.cifar10.archvie: unknown key; did you mean 'archive'?" in out
    assert "plasticity.n_pair: unknown key; did you mean 'n_pairs'?" in out
    assert "Failed validating" not in out  # ours, not the schema's first-error dump
    assert "Building DAG" not in out and "download" not in out


# --- a dataset's url, archive and checksums ------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"checksums": {"102flower.tgz": SHA256}},
            "datasets.flowers102.checksums: '102flower.tgz' is not a file of this flowers102 "
            "entry; did you mean '102flowers.tgz'? (its files: 102flowers.tgz, "
            "imagelabels.mat, setid.mat)",
        ),
        (
            {"archive": {"labels.mat": "/x"}},
            "datasets.flowers102.archive: 'labels.mat' is not a file of this flowers102 entry; "
            "did you mean 'imagelabels.mat'? (its files: 102flowers.tgz, imagelabels.mat, setid.mat)",
        ),
        (
            {"url": {"flowers.tgz": "https://m.example/f.tgz"}},
            "datasets.flowers102.url: 'flowers.tgz' is not a file of this flowers102 entry; "
            "did you mean '102flowers.tgz'?",
        ),
        (
            {"checksums": {"setid.mat": "md5:abc"}},
            "datasets.flowers102.checksums.setid.mat: 'md5:abc': md5 digests have 32 hex digits",
        ),
        (
            {"checksums": {"setid.mat": "sha256:" + "g" * 64}},
            "sha256 digests have 64 hex digits",
        ),
        (
            {"checksums": {"setid.mat": "a5357ecc9cb78c4bef273ce3793fc85c"}},
            "datasets.flowers102.checksums.setid.mat: 'a5357ecc9cb78c4bef273ce3793fc85c' is not "
            "'md5:<hex>' or 'sha256:<hex>'",
        ),
        (
            {"checksums": {"setid.mat": "sha1:" + "a" * 40}},
            "is not 'md5:<hex>' or 'sha256:<hex>'",
        ),
        (
            {"url": "https://m.example/flowers"},
            "datasets.flowers102.url: 'https://m.example/flowers' is one URL but this flowers102 "
            "entry needs 3 files (102flowers.tgz, imagelabels.mat, setid.mat): end it with '/' "
            "if it is a folder holding them under these names, or map each file to its URL",
        ),
    ],
)
def test_dataset_file_overrides_are_checked_at_config_time(
    paper_config: dict, entry: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(merged(paper_config, {"datasets": {"flowers102": entry}}))


def test_single_urls_and_valid_checksums_pass(paper_config: dict) -> None:
    check_config(
        merged(
            paper_config,
            {
                "datasets": {
                    # One file: a plain URL is that file's.
                    "cifar10": {
                        "url": "https://m.example/c10.tgz",
                        "checksums": {"cifar-10-python.tar.gz": SHA256},
                    },
                    "domainnet-sketch": {"url": "https://m.example/sketch.zip"},  # split random
                    "flowers102": {
                        "url": "https://m.example/flowers/",
                        "checksums": {"setid.mat": "MD5:A5357ECC9CB78C4BEF273CE3793FC85C"},
                    },
                }
            },
        )
    )


def test_multi_file_url_of_an_official_domainnet_split_needs_a_slash(paper_config: dict) -> None:
    entry = {"split": "official", "url": "https://m.example/sketch.zip"}
    with pytest.raises(ConfigError, match=r"datasets\.domainnet-sketch\.url: .* needs 3 files"):
        check_config(merged(paper_config, {"datasets": {"domainnet-sketch": entry}}))


def test_datasets_sharing_a_download_must_agree_on_its_checksum(paper_config: dict) -> None:
    other = "sha256:" + "cd" * 32
    config = merged(
        paper_config,
        {
            "datasets": {
                "c10c-snow": {"checksums": {"CIFAR-10-C.tar": SHA256}},
                "c10c-contrast": {"checksums": {"CIFAR-10-C.tar": other}},
                "c10c-motion_blur": {"checksums": {"CIFAR-10-C.tar": SHA256}},
            }
        },
    )
    with pytest.raises(ConfigError) as error:
        check_config(config)
    message = str(error.value)
    assert "conflicting checksums overrides for CIFAR-10-C.tar" in message
    assert f"datasets.c10c-contrast.checksums.CIFAR-10-C.tar: {other}" in message
    assert f"datasets.c10c-snow.checksums.CIFAR-10-C.tar: {SHA256}" in message


def test_multi_file_url_without_slash_stops_snakemake(tmp_path: Path) -> None:
    result = paper_dry_run(
        tmp_path, "all", edit="datasets:\n  pet: {url: 'https://mirror.example/pets'}\n"
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "datasets.pet.url: 'https://mirror.example/pets' is one URL" in out
    assert "end it with '/'" in out
    assert "Building DAG" not in out


# --- the run grid and one source of defaults ---------------------------------------------------


def test_paper_grid_is_1560_finetuning_jobs(paper_config: dict) -> None:
    """The 7 configurations of docs/protocol.md (full, emb, ln1, mha, ln2, fc1, fc2) for every
    (model, dataset, lr, seed) of the three experiments, plus SGD's head-only baseline.

    docs/protocol.md's total of 1,356 counts Adam and the model-size ablation as 288 and 144 runs,
    i.e. 6 configurations each, though it lists 7 per cell; with 7 they are 336 and 168.
    """
    runs = [
        run
        for name in enabled_experiments(paper_config)
        for run in experiment_runs(paper_config, name)
    ]
    assert enabled_experiments(paper_config) == ["sgd", "adam", "model_size"]
    seven = [run for run in runs if run.configuration != "head"]
    assert len(seven) == 11 * 4 * 3 * 7 + 4 * 4 * 3 * 7 + 2 * 4 * 3 * 7 == 924 + 336 + 168
    assert len(runs) - len(seven) == 11 * 4 * 3  # linear probing, SGD only
    assert len(runs) == len({run.directory for run in runs}) == 1560


# The blocks the rules read key by key, with no fallback of their own: every optional key
# has its default in the schema, which Snakemake's validate fills in.
SETTINGS_BLOCKS = (
    "finetune",
    "finetune.lora",
    "plasticity",
    "reference",
    "text_plasticity",
    "report",
    "report.figures",
    "report.criteria",
    "recommend",
    "scheduler",
)


def schema_block(path: str) -> dict:
    node = SCHEMA_DICT
    for key in path.split("."):
        node = node["properties"][key]
    return node


MODEL_FAMILIES = ("timm_model", "transformers_model")


@pytest.mark.parametrize("block", [*SETTINGS_BLOCKS, *MODEL_FAMILIES])
def test_every_optional_setting_has_its_default_in_the_schema(block: str) -> None:
    """Every optional key of a settings block, and of each family's model entry, has its
    default beside it (where Snakemake's validate fills it in: not behind a $ref)."""
    node = SCHEMA_DICT["definitions"][block] if block in MODEL_FAMILIES else schema_block(block)
    required = set(node.get("required", []))
    missing = [
        key
        for key, item in node["properties"].items()
        if key not in required and "default" not in item
    ]
    assert not missing, f"{block}: optional keys without a schema default: {missing}"


def config_block(config: dict, path: str) -> dict:
    for key in path.split("."):
        config = config[key]
    return config


@pytest.mark.parametrize(
    "block",
    [
        "finetune",
        "plasticity",
        "reference",
        "report",
        "report.figures",
        "report.criteria",
        "recommend",
        "scheduler",
    ],
)
def test_schema_defaults_are_the_papers_settings_of_config_yaml(
    paper_config: dict, block: str
) -> None:
    """A block cut to its required keys validates back to config.yaml's block: the schema's
    defaults and config.yaml's values have not drifted apart."""
    config = copy.deepcopy(paper_config)
    *parents, name = block.split(".")
    parent = config_block(config, ".".join(parents)) if parents else config
    required = schema_block(block).get("required", [])
    parent[name] = {key: value for key, value in parent[name].items() if key in required}
    validate(config, SCHEMA)
    assert config_block(config, block) == config_block(paper_config, block)


def test_an_absent_optional_block_gets_its_defaults(paper_config: dict) -> None:
    config = copy.deepcopy(paper_config)
    del config["text_plasticity"]
    del config["finetune"]["lora"]
    validate(config, SCHEMA)
    assert config["finetune"]["lora"] == paper_config["finetune"]["lora"]  # r 8, alpha 16
    text = config["text_plasticity"]
    assert text["enabled"] is False and text["run_models"] == [] and text["datasets"] == []
    assert text["protocols"] == ["embedding"] and text["n_pairs"] == 12800


def test_absent_report_and_recommend_blocks_get_their_defaults(paper_config: dict) -> None:
    """The report and recommend rules read report.figures, report.criteria and recommend key
    by key: absent, each is filled in whole (the schema's `default: {}` on the block)."""
    config = copy.deepcopy(paper_config)
    del config["recommend"]
    del config["report"]["figures"]
    del config["report"]["criteria"]
    validate(config, SCHEMA)
    assert config["report"] == paper_config["report"]
    assert config["recommend"] == paper_config["recommend"]
    figures = config["report"]["figures"]
    assert (figures["width_in"], figures["dpi"], figures["context"]) == (3.4, 200, "paper")
    assert config["recommend"]["enabled"] is False and config["recommend"]["n_pairs"] is None


def test_rules_read_settings_without_fallbacks() -> None:
    """No `.get(key, default)` in the workflow's rules: a default written there as well as in
    the schema would drift from it."""
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted((REPO / "workflow").rglob("*.smk"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\.get\(", line)
    ]
    assert not found, "\n".join(found)


# --- models: one block, a family per entry -------------------------------------------------------


def docs_models_example() -> dict:
    """The YAML example of docs/configuration.md's "Naming a model" section."""
    page = (REPO / "docs/configuration.md").read_text()
    section = page[page.index("## Naming a model") :]
    return yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])


def validated(config: dict) -> dict:
    """``config`` through the Snakefile's checks, in its order; returns it with defaults."""
    check_keys(config, SCHEMA_DICT)
    validate(config, SCHEMA)
    check_config(config)
    return config


def test_every_family_of_the_docs_example_is_accepted(paper_config: dict) -> None:
    example = docs_models_example()
    assert {entry["family"] for entry in example["models"].values()} == set(MODEL_ID_KEYS)
    config = validated(merged(paper_config, example))
    models = config["models"]
    # Each family gets its own defaults, none of the other's.
    definitions = SCHEMA_DICT["definitions"]
    assert set(models["dinov3_base"]) == set(definitions["timm_model"]["properties"])
    assert set(models["dinov2_small"]) == set(definitions["transformers_model"]["properties"])
    assert models["dinov2_small"] == {
        "family": "transformers",
        "hf_id": "facebook/dinov2-small",
        "weights": "hub",
        "revision": "main",
        "config": {},
        "model_class": None,
        "init_seed": 0,
        "normalize": "pretrained",
        "crop_pct": None,
    }
    assert models["clip_b16"]["model_class"] == "CLIPVisionModel"
    assert models["tiny_llama"]["weights"] == "random"
    assert config["text_plasticity"]["run_models"] == ["qwen3_small", "tiny_llama"]
    # The example's image models can be measured and finetuned like the paper's.
    stages = {
        "plasticity": {"models": ["vit_base", "dinov3_base", "dinov2_small", "clip_b16"]},
        "experiments": {"sgd": {"models": ["dinov2_small", "clip_b16"]}},
    }
    validated(merged(merged(paper_config, example), stages))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"family": "timm", "timm_id": "vit_tiny_patch16_224", "hf_id": "x"},
            "models.m.hf_id: not a key of family 'timm' (a key of transformers; timm accepts: "
            "crop_pct, family, init_seed, kwargs, normalize, revision, timm_id, weights)",
        ),
        (
            {"family": "timm", "timm_id": "vit_tiny_patch16_224", "config": {"depth": 2}},
            "models.m.config: not a key of family 'timm' (a key of transformers; timm accepts: "
            "crop_pct, family, init_seed, kwargs, normalize, revision, timm_id, weights)",
        ),
        (
            {**DINOV2, "kwargs": {"depth": 2}},
            "models.m.kwargs: not a key of family 'transformers' (a key of timm; transformers "
            "accepts: config, crop_pct, family, hf_id, init_seed, model_class, normalize, "
            "revision, weights)",
        ),
        (
            {**DINOV2, "timm_id": "vit_small_patch14_dinov2"},
            "models.m.timm_id: not a key of family 'transformers' (a key of timm; transformers "
            "accepts: config, crop_pct, family, hf_id, init_seed, model_class, normalize, "
            "revision, weights)",
        ),
        (
            {**DINOV2, "tokenizer": "x"},
            "models.m.tokenizer: unknown key (valid here: config, crop_pct, family, hf_id, "
            "init_seed, model_class, normalize, revision, weights)",
        ),
        (
            {"family": "hf", "hf_id": "x"},
            "models.m.family: unknown family 'hf' (families: timm, transformers)",
        ),
    ],
)
def test_a_key_of_the_wrong_family_names_the_familys_keys(
    paper_config: dict, entry: dict, message: str
) -> None:
    config = merged(paper_config, {"models": {"m": entry}})
    assert unknown_keys(config, SCHEMA_DICT) == [message]
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_keys(config, SCHEMA_DICT)


OLD_TIMM = {"timm_id": "vit_tiny_patch16_224", "weights": "random"}
OLD_TEXT = {"source": "random", "hf_id": "gpt2", "config": {"n_layer": 2}, "init_seed": 0}


@pytest.mark.parametrize(
    ("override", "messages"),
    [
        (
            {"models": {"old_vit": OLD_TIMM}},
            [
                "models.old_vit: no family: key (every model entry names its family now): add "
                "family: timm (its timm_id names a timm model)"
            ],
        ),
        (
            {"models": {"old_vit": {**OLD_TIMM, "kwarg": {}}}},
            [
                "models.old_vit: no family: key (every model entry names its family now): add "
                "family: timm (its timm_id names a timm model)",
                "models.old_vit.kwarg: unknown key; did you mean 'kwargs'?",
            ],
        ),
        (
            {"text_plasticity": {"models": {"gpt2": OLD_TEXT}}},
            [
                "text_plasticity.models: no longer a key: text models are models like any other "
                "now: move each entry under models: with family: transformers (hf_id, weights, "
                "config, init_seed) and name it in text_plasticity.run_models"
            ],
        ),
        (
            {"models": {"gpt2": OLD_TEXT}},
            [
                "models.gpt2: no family: key (every model entry names its family now): add "
                "family: transformers (its hf_id names a transformers model)",
                "models.gpt2.source: no longer a key: the old text-model key: write weights: hub "
                "| random | <saved model folder> (with family: transformers)",
            ],
        ),
        (
            {"models": {"gpt2": {**OLD_TEXT, "family": "transformers"}}},
            [
                "models.gpt2.source: no longer a key: the old text-model key: write weights: hub "
                "| random | <saved model folder> (with family: transformers)"
            ],
        ),
        (
            {"models": {"m": {"weights": "random"}}},
            [
                "models.m: no family: key; add family: timm (with timm_id) or family: "
                "transformers (with hf_id)"
            ],
        ),
    ],
)
def test_old_keys_are_rejected_naming_the_replacement(
    paper_config: dict, override: dict, messages: list[str]
) -> None:
    config = merged(paper_config, override)
    assert unknown_keys(config, SCHEMA_DICT) == messages
    with pytest.raises(ConfigError, match=re.escape(messages[0])):
        check_keys(config, SCHEMA_DICT)


OLD_TEXT_KEYS = [
    ("text_plasticity", "tokenizer", "auto"),
    ("text_plasticity", "sequence_length", 64),
]


@pytest.mark.parametrize(("block", "key", "value"), OLD_TEXT_KEYS)
def test_an_old_text_block_key_says_it_moved_into_the_text_dataset_entry(
    paper_config: dict, block: str, key: str, value: object
) -> None:
    config = merged(paper_config, {block: {key: value}})
    (message,) = unknown_keys(config, SCHEMA_DICT)
    assert message.startswith(f"{block}.{key}: no longer a key: text files are datasets: entries")
    assert f"and {key} is a key of each: datasets: {{<name>: {{source: text_file" in message


OLD_TEXT_GRIDS = [
    {"enabled": True, "run_models": ["gpt2"], "datasets": ["wiki"], "lrs": [1e-4]},
    {"tokenizer": "bytes", "sequence_length": 64, "steps": 100, "val_every": 10},
    {"datasets": {"wiki": "wiki.txt"}},
    {"mask_probability": 0.2},
    {"enabled": False},
]


@pytest.mark.parametrize("block", OLD_TEXT_GRIDS, ids=lambda block: "+".join(block))
def test_the_old_text_grid_says_it_is_an_experiment_now(paper_config: dict, block: dict) -> None:
    """text_finetune, whatever it holds (every key of the old block, the older file map), is
    one message: write the grid as an experiments: entry."""
    config = merged(paper_config, {"text_finetune": block})
    assert unknown_keys(config, SCHEMA_DICT) == [
        "text_finetune: no longer a key: a text finetuning grid is an experiments: entry now, "
        "as an image one: experiments: {<name>: {optimizer: adamw, models: [<text models>], "
        "datasets: [<text datasets: source text_file, each with its steps, val_every, "
        "tokenizer, sequence_length>], configurations: [...], lrs: [...], seeds: [...]}}; "
        "mask_probability is finetune.mask_probability; the check is "
        "results/stats/<name>/criteria.md"
    ]


@pytest.mark.parametrize("block", ["text_plasticity"])
def test_an_old_text_file_map_says_datasets_are_names_now(paper_config: dict, block: str) -> None:
    config = merged(paper_config, {block: {"datasets": {"wiki": "wiki.txt"}}})
    messages = unknown_keys(config, SCHEMA_DICT)
    assert messages == [
        f"{block}.datasets.wiki: no longer a key: {block}.datasets is a list of dataset names "
        "now: move each file into datasets: as {<name>: {source: text_file, path: <file>, "
        f"steps: <n>, val_every: <n>}}}} and write {block}.datasets: [<name>, ...]"
    ]


def test_the_old_layout_stops_snakemake_before_planning(tmp_path: Path) -> None:
    """A config written for the timm-only models block and text_plasticity.models: every old
    key named with its replacement, before any job is planned."""
    edit = yaml.safe_dump(
        {
            "models": {"old_vit": OLD_TIMM},
            "text_plasticity": {"run_models": ["gpt2"], "models": {"gpt2": OLD_TEXT}},
        }
    )
    result = paper_dry_run(tmp_path, "all", edit=edit)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "2 unknown or outdated key(s)" in out
    assert "models.old_vit: no family: key" in out and "add family: timm" in out
    assert "text_plasticity.models: no longer a key" in out
    assert "Building DAG" not in out


LLAMA = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1}
RANDOM_LLAMA = {"family": "transformers", "hf_id": "llm", "weights": "random", "config": LLAMA}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"models": {"m": {"family": "transformers", "hf_id": "m", "weights": "random"}}},
            "models.m.config.model_type: missing (weights: random builds the model from its "
            "config alone, e.g. model_type: dinov2)",
        ),
        (
            {"text_plasticity": {"run_models": ["gpt3"]}},
            "text_plasticity.run_models: unknown model 'gpt3'",
        ),
        (
            {"text_plasticity": {"run_models": ["vit_base"]}},
            "text_plasticity.run_models: 'vit_base' is a timm model; text plasticity measures "
            "transformers text models (family: transformers)",
        ),
        (
            {
                "models": {
                    "dino": {**DINOV2, "weights": "random", "config": {"model_type": "dinov2"}}
                },
                "text_plasticity": {"run_models": ["dino"]},
            },
            "text_plasticity.run_models: 'dino' is a vision model (config.model_type 'dinov2'), "
            "not a text model",
        ),
        (
            {
                "models": {"llm": RANDOM_LLAMA},
                "plasticity": {"models": ["vit_base", "llm"]},
            },
            "plasticity.models: 'llm' is a text model (config.model_type 'llama'): measure it "
            "with text_plasticity.run_models",
        ),
        (
            {
                "models": {"llm": RANDOM_LLAMA},
                "experiments": {"adam": {"models": ["llm"]}},
            },
            "experiments.adam.models: 'llm' is a text model",
        ),
    ],
)
def test_models_are_cross_checked_against_their_weights_and_stages(
    paper_config: dict, override: dict, message: str
) -> None:
    config = merged(paper_config, override)
    assert unknown_keys(config, SCHEMA_DICT) == []
    validate(config, SCHEMA)
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(config)


def test_text_models_pass_the_cross_checks(paper_config: dict, tmp_path: Path) -> None:
    """A random-init Llama, a hub GPT2 and a saved folder: text models by model_type, or
    told only when their job builds them (the hub and folder entries)."""
    folder = tmp_path / "my-qwen3"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    models = {
        "llm": RANDOM_LLAMA,
        "gpt2": {"family": "transformers", "hf_id": "gpt2"},
        "mine": {"family": "transformers", "hf_id": "my-qwen3", "weights": str(folder)},
    }
    override = {"models": models, "text_plasticity": {"run_models": list(models)}}
    validated(merged(paper_config, override))


def test_every_model_entry_of_a_shipped_config_names_its_family() -> None:
    for name, config in shipped_configs().items():
        for model, entry in config["models"].items():
            assert entry.get("family") in MODEL_ID_KEYS, (name, model)
            assert MODEL_ID_KEYS[entry["family"]] in entry, (name, model)


def test_model_id_keys_match_the_schemas_families() -> None:
    """Each family of the schema has its branch, and its id key (the key an entry without a
    family is told to pair with it) is required there."""
    entry = SCHEMA_DICT["properties"]["models"]["additionalProperties"]
    assert set(entry["properties"]["family"]["enum"]) == set(MODEL_ID_KEYS)
    definitions = SCHEMA_DICT["definitions"]
    for family, id_key in MODEL_ID_KEYS.items():
        branch = definitions[f"{family}_model"]
        assert branch["properties"]["family"]["const"] == family
        assert id_key in branch["required"] and branch["additionalProperties"] is False
    problems = unknown_keys({"models": {"m": {"family": ["timm"]}}}, SCHEMA_DICT)
    assert problems == ["models.m.family: unknown family ['timm'] (families: timm, transformers)"]
