from mgft_doctor.cli import main

raise SystemExit(main())
