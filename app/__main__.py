from localinfer.cli import main

main()
