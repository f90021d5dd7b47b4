from steersman.cli import main

main()
