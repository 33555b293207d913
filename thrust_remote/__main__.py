from thrust_remote.cli.main import run

run()
