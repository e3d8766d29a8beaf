"""`python -m minipaged.simulate`: runs the simulator's command line (minipaged.simulate.main)."""

from minipaged.simulate import main

raise SystemExit(main())
