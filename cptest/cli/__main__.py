from cptest.cli import main

main()
