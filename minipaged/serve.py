"""`python -m minipaged.serve`: the OpenAI-compatible server and its dashboard. A door
only: the code lives in minipaged/tools/ (docs/reading.md), apart from the engine."""

if __name__ == "__main__":
    from minipaged.tools.door import ctrl_c_ends_quietly

    with ctrl_c_ends_quietly():
        from minipaged.tools.serve.cli import main

        raise SystemExit(main())
