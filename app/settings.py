"""User settings: one typed pydantic model drives the JSON file, `EMBER_<FIELD>` env vars and CLI flags.

Precedence, lowest first: field defaults < settings file < environment < CLI flags.
`EMBER_HOME` relocates both the config and the data directory (tests point it at a tmp dir).
The file holds the API key, so it is written atomically and readable by its owner only.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import tempfile
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError,
                      ValidationInfo, field_validator, model_validator)

from app.speculative_setting import check_speculative
from engine.keep_alive import parse_keep_alive

log = logging.getLogger(__name__)

APP_NAME = "ember"
ENV_PREFIX = "EMBER_"
MODEL_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}$"


def config_dir() -> Path:
    """Where settings.json lives: $EMBER_HOME/config, else the platform's user config dir."""
    home = os.environ.get("EMBER_HOME")
    return Path(home) / "config" if home else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def default_data_dir() -> Path:
    """Models, chats and logs: $EMBER_HOME/data, else the platform's user data dir."""
    home = os.environ.get("EMBER_HOME")
    return Path(home) / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def settings_path() -> Path:
    return config_dir() / "settings.json"


def _new_api_key() -> str:
    return secrets.token_urlsafe(32)


def _check_url(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().rstrip("/")
    if not value:
        return None
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise ValueError(f"must be an http:// or https:// URL, not {value!r}")
    return value


def _keep_alive_text(value: Any) -> Any:
    """A number in the file or a JSON body is seconds, as Ollama reads it: kept as its text."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _check_keep_alive(value: str) -> str:
    parse_keep_alive(value)  # its ValueError names the value and the forms
    return value.strip()


KeepAlive = Annotated[str, BeforeValidator(_keep_alive_text), AfterValidator(_check_keep_alive)]


class Settings(BaseModel):
    """Every user-facing setting, with its bounds; the engine's own knobs live in EngineConfig."""

    model_config = ConfigDict(validate_assignment=True, extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir,
                           description="Folder for models, chat history and logs")
    models_dir: Path | None = Field(None, description="Folder of installed models (default: <data_dir>/models)")
    server_host: str = Field("127.0.0.1", min_length=1, max_length=253,
                             description="Address the local server binds; anything but loopback needs an API key")
    server_port: int = Field(8765, ge=0, le=65535, description="Port of the local server (0 picks a free one)")
    ollama_port: int = Field(0, ge=0, le=65535, description="Also serve on this port, for programs that expect "
                                                           "Ollama at 11434 (0: off)")
    ollama_keyless: bool = Field(False, description="Programs on this computer may use the Ollama port without "
                                                    "the API key (web pages still may not)")
    api_key: str = Field(default_factory=_new_api_key, min_length=8, max_length=512,
                         description="Bearer key that clients of the local server must send")
    backend: Literal["auto", "torch", "llama.cpp"] = Field("auto", description="Inference backend")
    device: Literal["auto", "cpu", "cuda", "mps"] = Field("auto", description="Compute device")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="Torch engine's dtype")
    kv_memory_fraction: float = Field(0.25, gt=0.0, le=0.95, description="Share of free memory given to the KV cache")
    kv_disk_gib: float = Field(4.0, ge=0.0, le=65536.0,
                               description="Disk that keeps the chats' context across restarts, in GiB "
                                           "(<data_dir>/kv-cache; 0: off; never more than a quarter of the free space)")
    threads: int | None = Field(None, ge=1, le=1024, description="CPU threads for inference (default: automatic)")
    memory_budget_gb: float = Field(0.0, ge=0.0, le=65536.0,
                                    description="Memory the loaded models may use together, in GiB "
                                                "(0: automatic, about 75% of this computer's memory)")
    max_loaded_models: int = Field(3, ge=1, le=16, description="The most models loaded at the same time")
    keep_alive: KeepAlive = Field("5m", description="How long a model nobody uses stays loaded: 5m, 1h30m, or "
                                                    "seconds; -1 keeps it loaded, 0 unloads it at once (as Ollama)")
    speculative: Annotated[str, AfterValidator(check_speculative)] = Field(
        "off", description="Speculative decoding: off, ngram (prompt lookup) or a draft model (an installed "
                           "model's id or a .gguf file); the replies are the same, only faster")
    theme: Literal["system", "light", "dark"] = Field("system", description="Window colour theme")
    default_model: str = Field("smollm2-135m-instruct-q4_1", pattern=MODEL_ID_PATTERN,
                               description="Model id loaded at start")
    close_to_tray: bool = Field(True, description="Closing the window keeps the server running in the tray")
    tray_notice_shown: bool = Field(False, description="The close-to-tray notice was shown once")
    window_geometry: str | None = Field(None, max_length=4096,
                                        description="The main window's last size and place (Qt's saved geometry)")
    hub_base_url: str = Field("https://huggingface.co", description="Base URL that model downloads come from")
    max_parallel_downloads: int = Field(2, ge=1, le=8, description="Downloads running at the same time")
    connection_url: str | None = Field(None, description="Remote OpenAI-compatible server (None: the local engine)")
    connection_key: str | None = Field(None, max_length=512, description="API key for the remote server")
    tool_step_limit: int = Field(10, ge=1, le=100, description="Tool-calling replies in one turn before the "
                                 "chat stops offering tools")
    tool_timeout_s: float = Field(60.0, gt=0.0, le=3600.0, description="Seconds a tool call may run before it "
                                  "is cancelled")
    embedding_model: str | None = Field(None, max_length=512, description="The model that indexes and searches "
                                        "documents (an installed id; none: the first installed embedding model)")
    fetch_image_urls: bool = Field(False, description="The engine fetches an image sent by http(s) URL (off: "
                                   "such a request is refused; images are sent as data)")

    # field -> (value in the file or None, value from the environment); save() keeps env values out of the file
    _env_overrides: dict[str, tuple[Any, Any]] = PrivateAttr(default_factory=dict)
    _path: Path | None = PrivateAttr(None)

    @field_validator("hub_base_url", "connection_url")
    @classmethod
    def _url(cls, v: str | None, info: ValidationInfo) -> str | None:
        v = _check_url(v)
        if v is None and info.field_name == "hub_base_url":
            raise ValueError("cannot be empty")
        return v

    @field_validator("data_dir", "models_dir")
    @classmethod
    def _expand(cls, v: Path | None) -> Path | None:
        return None if v is None else Path(v).expanduser()

    @model_validator(mode="after")
    def _default_models_dir(self) -> Settings:
        # models_dir follows data_dir until it is set to something else (also on later assignments)
        derived = self.__dict__.get("_derived_models_dir")
        if self.models_dir is None or self.models_dir == derived:
            derived = self.data_dir / "models"
            self.__dict__["models_dir"] = derived  # straight into the dict: no validate_assignment recursion
            self.__dict__["_derived_models_dir"] = derived
        return self

    # ---- derived paths (not stored) ----
    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def kv_cache_dir(self) -> Path:
        """The prefix cache's disk tier (engine/kv_disk/): `ember cache` reads it."""
        return self.data_dir / "kv-cache"

    @property
    def history_path(self) -> Path:
        return self.data_dir / "chats.sqlite3"

    @property
    def docs_dir(self) -> Path:
        """The documents store (engine/docs/): its database and the uploaded files."""
        return self.data_dir / "documents"

    @property
    def path(self) -> Path:
        """The file this object was loaded from (or will be saved to)."""
        return self._path or settings_path()

    # ---- persistence ----
    @classmethod
    def load(cls, path: Path | str | None = None, env: typing.Mapping[str, str] | None = None) -> Settings:
        """Read the file, apply `EMBER_*` env vars; a missing or corrupt file gives defaults (never raises).

        A corrupt file is kept aside as `<name>.bak`; a first load (or a file without a key) saves a new API key.
        """
        path = Path(path) if path is not None else settings_path()
        env = os.environ if env is None else env
        stored, needs_save = _read_file(path)
        overrides = _env_values(env)
        merged = {**stored, **overrides}
        try:
            settings = cls.model_validate(merged)
        except ValidationError as e:  # an env var is bad (the file part was validated already)
            bad = {str(err["loc"][0]) for err in e.errors() if err["loc"]}
            for name in bad:
                log.warning("ignoring %s%s=%r: %s", ENV_PREFIX, name.upper(), overrides.get(name),
                            "; ".join(err["msg"] for err in e.errors() if err["loc"] and err["loc"][0] == name))
                overrides.pop(name, None)
            settings = cls.model_validate({**stored, **overrides})
        settings._path = path
        settings._env_overrides = {k: (stored.get(k), getattr(settings, k)) for k in overrides}
        if needs_save or "api_key" not in stored:
            try:
                settings.save()
            except OSError as e:
                log.warning("could not save settings to %s: %s", path, e)
        return settings

    def save(self, path: Path | str | None = None) -> Path:
        """Write atomically (temp file + rename), mode 0600; env-var values are not persisted."""
        path = Path(path) if path is not None else self.path
        data = self.model_dump(mode="json")
        for name, (file_value, env_value) in self._env_overrides.items():
            if getattr(self, name) == env_value:  # unchanged since load: keep the file's own value
                if file_value is None:
                    data.pop(name, None)
                else:
                    data[name] = file_value
        if data.get("models_dir") == str(Path(data.get("data_dir", self.data_dir)) / "models"):
            data.pop("models_dir")  # follows data_dir
        if data.get("data_dir") == str(default_data_dir()):
            data.pop("data_dir")  # follows EMBER_HOME / the platform
        _atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
        self._path = path
        return path

    def ensure_dirs(self) -> None:
        for d in (self.data_dir, self.models_dir, self.logs_dir):
            Path(d).mkdir(parents=True, exist_ok=True)


def _read_file(path: Path) -> tuple[dict[str, Any], bool]:
    """Valid stored fields, and whether the file must be rewritten (missing, corrupt, partly invalid)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, True
    except OSError as e:
        log.warning("cannot read settings file %s (%s); using defaults", path, e)
        return {}, False
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("top level is not an object")
    except ValueError as e:
        _keep_aside(path, f"settings file {path} is corrupt ({e}); using defaults")
        return {}, True
    known = {k: v for k, v in data.items() if k in Settings.model_fields}
    try:
        Settings.model_validate(known)
        return known, False
    except ValidationError as e:
        bad = {str(err["loc"][0]) for err in e.errors() if err["loc"]} or set(known)
        _keep_aside(path, f"settings file {path} has invalid values for {', '.join(sorted(bad))} "
                          f"({e.error_count()} errors); those fall back to defaults")
        return {k: v for k, v in known.items() if k not in bad}, True


def _keep_aside(path: Path, message: str) -> None:
    backup = path.with_name(path.name + ".bak")
    try:
        os.replace(path, backup)
        message += f"; the old file is kept as {backup}"
    except OSError:
        pass
    log.warning(message)


def _env_values(env: typing.Mapping[str, str]) -> dict[str, Any]:
    """`EMBER_SERVER_PORT=9000` -> {"server_port": "9000"}; pydantic converts the strings. Empty means None."""
    out: dict[str, Any] = {}
    for name, field in Settings.model_fields.items():
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        out[name] = None if raw == "" and _is_optional(field.annotation) else raw
    return out


def _is_optional(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
