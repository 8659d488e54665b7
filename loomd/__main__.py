from loomd.cli import main

main()
