from envforge.cli import main

main()
