"""Test helpers for the model store and downloads: tiny real model files and a fault-injecting
hub on 127.0.0.1 (a real HTTP server in a thread, speaking the hub's /resolve/ route)."""
from __future__ import annotations

import hashlib
import json
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qs

import numpy as np


def write_tiny_gguf(path: Path, *, name: str = "Tiny Test Model", pad_mb: float = 0.0, seed: int = 0,
                    arch: str = "llama", file_type: int | None = 0, ctx: int = 512,
                    floats: dict[str, float] | None = None) -> Path:
    """A valid llama-shaped GGUF (2 layers, 4 heads, 2 KV heads, head dim 16) plus optional padding
    tensors to make it a few MB. Parameter count = sum of the tensors' elements. `floats` adds
    float32 keys (e.g. {"general.sampling.temp": 0.3})."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(ctx)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    if file_type is not None:
        w.add_file_type(file_type)
    for key, value in (floats or {}).items():
        w.add_float32(key, value)
    w.add_tensor("token_embd.weight", rng.standard_normal((32, 64), dtype=np.float32))
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_q.weight", rng.standard_normal((64, 64), dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_k.weight", rng.standard_normal((32, 64), dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, dtype=np.float32))
    n_pad = int(pad_mb * (1 << 20) / 4 / 1024)
    if n_pad:
        w.add_tensor("pad.weight", rng.standard_normal((n_pad, 1024), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def tiny_gguf_params(pad_mb: float = 0.0) -> int:
    n_pad = int(pad_mb * (1 << 20) / 4 / 1024)
    return 32 * 64 + 2 * (64 * 64 + 32 * 64 + 64) + n_pad * 1024


def write_gptq_dir(path: Path, *, method: str = "gptq", bits: int = 4, in_f: int = 64, out_f: int = 32) -> Path:
    """A GPTQ/AWQ-shaped directory: config.json with quantization_config + one safetensors file."""
    path.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": in_f,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
              "max_position_embeddings": 4096,
              "quantization_config": {"quant_method": method, "bits": bits, "group_size": 32}}
    (path / "config.json").write_text(json.dumps(config))
    pack = 32 // bits
    tensors = {  # name -> (dtype, shape)
        "model.layers.0.self_attn.q_proj.qweight": ("I32", [in_f // pack, out_f]),
        "model.layers.0.self_attn.q_proj.qzeros": ("I32", [in_f // 32, out_f // pack]),
        "model.layers.0.self_attn.q_proj.scales": ("F16", [in_f // 32, out_f]),
        "model.embed_tokens.weight": ("F16", [10, in_f]),
    }
    header, blobs, off = {}, [], 0
    for name, (dt, shape) in tensors.items():
        n = int(np.prod(shape)) * (4 if dt == "I32" else 2)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        blobs.append(b"\x01" * n)
        off += n
    raw = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    return path


def gptq_dir_params(in_f: int = 64, out_f: int = 32) -> int:
    return in_f * out_f + 10 * in_f  # unpacked qweight + embeddings (zeros/scales excluded)


def bundled_model_or_skip() -> Path:
    """The bundled SmolLM2 file; the test is skipped where the package is not installed."""
    import pytest
    from engine.model_files.bundled import default_model_path

    try:
        return default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Fault:
    """What the server does to one file. Counters are how many requests get the fault."""
    status: int | None = None  # answer with this status...
    status_times: int = 10**9  # ...for this many requests
    drop_at: int | None = None  # reset the connection after sending this many body bytes...
    drop_times: int = 1
    truncate_at: int | None = None  # close cleanly after this many body bytes (Content-Length says more)
    truncate_times: int = 1
    max_body: int | None = None  # every response closes cleanly after this many body bytes
    no_range: bool = False  # ignore Range, always 200 from byte 0
    stall_s: float = 0.0  # sleep this long before the body...
    stall_times: int = 1
    chunk_delay_s: float = 0.0  # sleep between 64 KiB chunks (a slow but steady server)
    hold_at: int | None = None  # stop at this byte of the file until `release` is set: a transfer
    release: threading.Event = field(default_factory=threading.Event)  # surely unfinished till then
    etag_sha256: str | None = None  # send X-Linked-Etag with this value
    redirect_to: str | None = None  # answer 302 with this Location


@dataclass
class FakeHub:
    files: dict[str, bytes] = field(default_factory=dict)  # url path -> bytes
    faults: dict[str, Fault] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    tls: tuple[Path, Path] | None = None  # (certfile, keyfile): serve https
    server: ThreadingHTTPServer | None = None
    # the hub's JSON API (/api/...): url path -> f(query params) -> body; see hub_api_fake.py
    api: dict[str, Callable[[dict[str, list[str]]], object]] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    def add(self, repo: str, name: str, data: bytes, fault: Fault | None = None) -> str:
        path = f"/{repo}/resolve/main/{name}"
        self.files[path] = data
        if fault:
            self.faults[path] = fault
        return path

    def ranges(self, path: str) -> list[str | None]:
        return [r for p, r in self.requests if p == path]

    def __enter__(self) -> "FakeHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                hub.requests.append((self.path, self.headers.get("Range")))
                route, _, query = self.path.partition("?")
                if route in hub.api:
                    body = json.dumps(hub.api[route](parse_qs(query))).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if route.startswith("/api/"):
                    return self._plain(404)
                fault = hub.faults.get(self.path, Fault())
                data = hub.files.get(self.path)
                if fault.redirect_to:
                    self.send_response(302)
                    self.send_header("Location", fault.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if fault.status is not None and fault.status_times > 0:
                    fault.status_times -= 1
                    return self._plain(fault.status)
                if data is None:
                    return self._plain(404)
                start, status = 0, 200
                rng = self.headers.get("Range")
                if rng and not fault.no_range:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    status = 206
                self.send_response(status)
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("Accept-Ranges", "none" if fault.no_range else "bytes")
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                if fault.etag_sha256:
                    self.send_header("X-Linked-Etag", f'"{fault.etag_sha256}"')
                self.end_headers()
                if fault.stall_s and fault.stall_times > 0:
                    fault.stall_times -= 1
                    time.sleep(fault.stall_s)
                body = memoryview(data)[start:]
                limit, mode = len(body), None
                if fault.drop_at is not None and fault.drop_times > 0 and start < fault.drop_at:
                    fault.drop_times -= 1
                    limit, mode = fault.drop_at - start, "reset"
                elif fault.truncate_at is not None and fault.truncate_times > 0 and start < fault.truncate_at:
                    fault.truncate_times -= 1
                    limit, mode = fault.truncate_at - start, "close"
                elif fault.max_body is not None and fault.max_body < len(body):
                    limit, mode = fault.max_body, "close"
                try:
                    for i in range(0, limit, 1 << 16):
                        if fault.hold_at is not None and start + i >= fault.hold_at and not fault.release.wait(60):
                            return  # never released: the test has failed; end this transfer
                        self.wfile.write(body[i:min(i + (1 << 16), limit)])
                        if fault.chunk_delay_s:
                            time.sleep(fault.chunk_delay_s)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
                if mode == "reset":  # RST: the client sees ECONNRESET mid-body
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                if mode:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR) if mode == "close" else None
                    self.connection.close()

            def _plain(self, code: int):
                body = f"error {code}".encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # clients we hang up on (faults, cancelled jobs) are expected here

        self.server = Server(("127.0.0.1", 0), Handler)
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*map(str, self.tls))
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def self_signed_cert(tmp: Path) -> tuple[Path, Path] | None:
    """A self-signed certificate for 127.0.0.1 made with the openssl CLI; None when it is missing."""
    import shutil
    import subprocess

    if not shutil.which("openssl"):
        return None
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key
