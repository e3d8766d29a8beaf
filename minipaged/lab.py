"""`python -m minipaged.lab`: the labs' checker and hints. A door only: the code lives
in minipaged/tools/ (docs/reading.md), apart from the engine a student reads."""

if __name__ == "__main__":
    from minipaged.tools.door import ctrl_c_ends_quietly

    with ctrl_c_ends_quietly():
        from minipaged.tools.lab.cli import main

        raise SystemExit(main())
