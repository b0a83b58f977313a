from planner.cli import main

main()
