import sys

from minipaged.bench import main

sys.exit(main())
