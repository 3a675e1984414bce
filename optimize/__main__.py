from optimize.cli import main

main()
