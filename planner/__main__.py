from planner.console import run

run()
