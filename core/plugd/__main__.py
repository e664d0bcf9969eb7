from plugd.cli import main

main()
