"""A vision model in the store: `ember models import MODEL --mmproj PROJ` keeps both files and pairs
them in the manifest; `models list` says the model takes images; a load from the store (the
server's `--model-id`, `ember chat --model ID`) gets its projector; `models verify` hashes both and
`models rm` removes both. A wrong pair is refused in words before anything is copied: a projector
as the model, a model as the projector, a missing file, another model's projector (its width), an
M-RoPE projector of a kind not supported yet (Qwen3-VL's; Qwen2-VL's and Qwen2.5-VL's pass). Files: tests/vlm_factory.py's tiny random vision model."""
from __future__ import annotations

import json

import pytest

from app.cli import main
from app.cli_model import installed_mmproj
from app.store import ModelStore
from engine.model_files.errors import ModelFileError
from engine.server.model_store import ModelStore as ServedModels
from vlm_factory import write_mmproj, write_tiny_qwen2vl, write_tiny_vlm


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return write_tiny_vlm(tmp_path_factory.mktemp("vlm"))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "home"))
    return tmp_path / "home" / "data" / "models"


def run(capsys, *argv):
    rc = main(["models", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_import_pairs_lists_verifies_and_removes_both_files(vlm, home, capsys):
    rc, out, err = run(capsys, "import", str(vlm.model), "--mmproj", str(vlm.mmproj), "--id", "eye")
    assert rc == 0, err
    assert "with its projector" in out
    m = ModelStore(home).get("eye")
    assert m.mmproj == str(home / "eye" / "mmproj.gguf") and m.path == str(home / "eye" / "lm.gguf")
    assert (home / "eye" / "mmproj.gguf").read_bytes() == vlm.mmproj.read_bytes()  # a copy; the source stays
    assert m.size_bytes == vlm.model.stat().st_size + vlm.mmproj.stat().st_size  # what it takes, as the catalog's
    assert vlm.mmproj.is_file()
    assert ServedModels(home).get("eye").mmproj == m.mmproj  # what the server loads from the store
    assert installed_mmproj("eye") == m.mmproj  # what `ember chat --model eye` loads
    rows = {r["id"]: r for r in json.loads(run(capsys, "list", "--json")[1])}
    assert rows["eye"]["mmproj"] == m.mmproj and rows["eye"]["mmproj_sha256"]
    table = run(capsys, "list")[1].splitlines()
    assert "INPUT" in table[0] and "text+images" in next(ln for ln in table if ln.startswith("eye "))
    assert run(capsys, "verify", "eye")[:2] == (0, "eye: OK\n")
    with open(m.mmproj, "r+b") as f:  # the projector's bytes count in verify too
        f.seek(-1, 2)
        f.write(b"\x01")
    assert run(capsys, "verify", "eye")[0] == 1
    rc, out, _ = run(capsys, "rm", "eye")
    assert rc == 0 and not (home / "eye").exists() and "left in place" not in out


def test_a_linked_pair_is_left_in_place_on_rm(vlm, home, capsys):
    assert run(capsys, "import", str(vlm.model), "--mmproj", str(vlm.mmproj), "--id", "eye", "--link")[0] == 0
    m = ModelStore(home).get("eye")
    assert (m.path, m.mmproj) == (str(vlm.model.resolve()), str(vlm.mmproj.resolve()))
    rc, out, _ = run(capsys, "rm", "eye")
    assert rc == 0 and str(vlm.mmproj.resolve()) in out and vlm.mmproj.is_file() and vlm.model.is_file()


def test_importing_an_installed_model_again_with_mmproj_pairs_it(vlm, tmp_path):
    store = ModelStore(tmp_path / "models")
    plain = store.import_path(vlm.model, model_id="eye")
    assert plain.mmproj is None and installed_mmproj("eye") is None
    paired = store.import_path(vlm.model, mmproj=vlm.mmproj)
    assert paired.id == "eye" and paired.mmproj == str(tmp_path / "models" / "eye" / "mmproj.gguf")
    assert [m.id for m in store.list()] == ["eye"] and store.verify("eye")


@pytest.mark.parametrize("case, says", [
    ("projector-as-model", "a vision projector (an mmproj file), not a model that chats"),
    ("model-as-projector", "not a projector"),
    ("missing", "no such file"),
    ("other-width", "the projector of another model: it gives 32-wide embeddings, lm.gguf takes 64"),
    ("mrope", "'qwen3vl_merger' uses M-RoPE of a kind not supported yet (Qwen3-VL, Qwen2.5-Omni, GLM-4V; "
              "Qwen2-VL and Qwen2.5-VL are)"),
])
def test_a_wrong_pair_is_refused_in_words_before_any_copy(vlm, home, tmp_path, capsys, case, says):
    model, proj = vlm.model, vlm.mmproj
    if case == "projector-as-model":
        model = vlm.mmproj
    elif case == "model-as-projector":
        proj = vlm.model
    elif case == "missing":
        proj = tmp_path / "nope.gguf"
    elif case == "other-width":
        proj = write_mmproj(tmp_path / "other.gguf", lm_width=32)
    else:
        proj = write_mmproj(tmp_path / "qwen.gguf", projector_type="qwen3vl_merger")
    rc, _, err = run(capsys, "import", str(model), "--mmproj", str(proj))
    assert rc in (1, 2) and says in err and "Traceback" not in err
    assert not list(home.rglob("manifest.json")) and not list(home.rglob("*.gguf"))


def test_a_load_checks_the_pair_too(vlm, tmp_path):
    """The server's load of a manifest naming another model's projector fails in the same words."""
    from engine.service.loading import check_model_file
    from engine.service.served_model import ModelSpec

    other = write_mmproj(tmp_path / "other.gguf", lm_width=32)
    with pytest.raises(ModelFileError, match="the projector of another model"):
        check_model_file(ModelSpec(id="eye", path=str(vlm.model), mmproj=str(other)))
    qwen = write_mmproj(tmp_path / "qwen.gguf", projector_type="qwen3vl_merger")
    with pytest.raises(ModelFileError, match="not supported yet"):
        check_model_file(ModelSpec(id="eye", path=str(vlm.model), mmproj=str(qwen)))
    qwen25 = write_tiny_qwen2vl(tmp_path / "qwen25")  # Qwen2.5-VL's pair (M-RoPE the runner shifts) passes
    check_model_file(ModelSpec(id="qwen", path=str(qwen25.model), mmproj=str(qwen25.mmproj)))


def test_the_memory_budget_counts_the_projector(vlm):
    """A vision model's load is counted with its projector's bytes (libmtmd holds them beside the LM)."""
    from engine.service.loading import estimate_bytes
    from engine.service.residency import ResidencyConfig
    from engine.service.served_model import ModelSpec

    alone = estimate_bytes(ModelSpec(id="eye", path=str(vlm.model)), ResidencyConfig(), num_kv_blocks=64)
    seeing = estimate_bytes(ModelSpec(id="eye", path=str(vlm.model), mmproj=str(vlm.mmproj)), ResidencyConfig(),
                            num_kv_blocks=64)
    assert seeing == alone + vlm.mmproj.stat().st_size
