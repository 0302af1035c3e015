def main():
    raise SystemExit("ember: not built yet")
